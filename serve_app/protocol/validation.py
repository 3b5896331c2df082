"""Schema violations as the API's 400 (``invalid_value``, ``missing_required_parameter``,
``unknown_parameter``, ``invalid_json``), wherever a body is validated: the one error
mapper (``serve_app.ingress.errors``) for a request, the batch worker for a line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from serve_app.protocol.errors import InvalidRequestError


def param_from_loc(loc: Sequence[Any]) -> str | None:
    """``("body", "messages", 0, "role")`` -> ``messages[0].role``."""
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif isinstance(part, str) and not part.startswith(("function-", "tagged-union")):
            if part in ("str", "list[str]", "list[ContentPart]", "int", "float"):
                continue  # union branch names that pydantic adds to the location
            text += f".{part}" if text else part
    return text or None


def validation_error(errors: Sequence[Any]) -> InvalidRequestError:
    """The 400 of a body that failed its pydantic model: the first error, its parameter
    in ``messages[0].role`` form (FastAPI's ``RequestValidationError`` and pydantic's
    ``ValidationError`` list errors alike; a batch line is checked with the latter)."""
    if not errors:
        return InvalidRequestError("The request body is invalid.")
    first = errors[0]
    kind = str(first.get("type", ""))
    if kind == "json_invalid":
        return InvalidRequestError("The request body is not valid JSON.", code="invalid_json")
    loc = first.get("loc", ())
    param = param_from_loc(loc)
    if kind == "missing" and param is None:
        return InvalidRequestError("A JSON request body is required.", code="invalid_json")
    if kind == "missing":
        return InvalidRequestError(
            f"Missing required parameter: '{param}'.",
            code="missing_required_parameter",
            param=param,
        )
    if kind == "extra_forbidden":  # closed bodies (docs/reference/responses.md#request)
        return InvalidRequestError(
            f"Unknown parameter: '{param}'.", code="unknown_parameter", param=param
        )
    if kind == "model_attributes_type" and param is None:
        return InvalidRequestError("The request body must be a JSON object.", code="invalid_json")
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return InvalidRequestError(
        f"Invalid value for '{param}': {message}." if param else f"Invalid request: {message}.",
        code="invalid_value",
        param=param,
    )
