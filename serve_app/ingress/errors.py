"""The one error mapper: every failure becomes the spec's envelope (spec 2.1, 7).

Framework errors included: an unknown route is a 404, a wrong method a 405,
malformed JSON and schema violations a 400 (not FastAPI's 422) naming the
offending parameter in ``messages[0].role`` form.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.protocol.errors import (
    GatewayError,
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
)

logger = logging.getLogger(__name__)

_BODY_PARSE_FAILED = "There was an error parsing the body"
"""FastAPI's ``HTTPException`` detail when decoding a JSON body raised something other
than ``JSONDecodeError`` (``UnicodeDecodeError``, ``RecursionError``)."""


def error_response(err: GatewayError) -> JSONResponse:
    return JSONResponse(err.envelope(), status_code=err.status_code, headers=err.headers)


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


def validation_to_error(exc: RequestValidationError) -> InvalidRequestError:
    errors = list(exc.errors())
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
    if kind == "extra_forbidden":  # closed request bodies (responses route, spec 4.3)
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


def install_error_handlers(app: FastAPI) -> None:
    async def on_gateway_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, GatewayError)
        return error_response(exc)

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_to_error(exc))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            err: GatewayError = NotFoundError(
                f"Unknown route {request.method} {request.url.path}.", code="unknown_route"
            )
        elif exc.status_code == 405:
            err = MethodNotAllowedError(
                f"Method {request.method} is not allowed on {request.url.path}."
            )
        elif exc.status_code == 400 and exc.detail == _BODY_PARSE_FAILED:
            # FastAPI's answer to a body its JSON decoder failed on other than by a syntax
            # error: bytes that are not UTF-8, or nesting deeper than the decoder allows.
            err = InvalidRequestError(
                "The request body could not be read as JSON (it must be UTF-8 text, "
                "nested at most a few hundred levels deep).",
                code="invalid_json",
            )
        else:
            err = GatewayError(str(exc.detail), status_code=exc.status_code)
            err.error_type = "invalid_request_error" if exc.status_code < 500 else "api_error"
        err.headers.update(dict(exc.headers or {}))
        return error_response(err)

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=exc)
        return error_response(
            GatewayError("The server had an internal error.", code="internal_error")
        )

    app.add_exception_handler(GatewayError, on_gateway_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
