"""The optional fields of ``POST /v1/responses`` beyond prompt, tools and sampling.

Agent frameworks send these whatever the backend (the OpenAI Agents SDK always
sends ``include``, an empty list unless a tool or setting asks for more), so each
is decided here once, by one rule: honoured when the gateway can honour it,
accepted and named in ``x-service-ignored-params`` when it only tunes what the
gateway cannot change (a cache key, a service tier, a summary that is never
written), refused with 400 ``unsupported_parameter`` when the client would read
something back that is not there (an ``include`` value with no data behind it,
``background: true``). docs/api.md, "Responses and server tools", lists each choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from serve_app.catalog.catalog import honours_structured_outputs
from serve_app.catalog.config import CatalogModel
from serve_app.protocol.errors import InvalidRequestError
from serve_app.protocol.responses import (
    INCLUDABLE,
    ResponsesRequest,
    TextFormat,
    TextFormatEcho,
)

_UNSUP = "unsupported_parameter"
_TIERS_APPLIED = frozenset({"auto", "default"})
_VERBOSITY = ("low", "medium", "high")
_PLAIN_TEXT: TextFormat = {"type": "text"}


def _bad(message: str, param: str, code: str = _UNSUP) -> InvalidRequestError:
    return InvalidRequestError(message, code=code, param=param)


@dataclass
class ResponseOptions:
    """How the route applies the optional fields of one request."""

    logprobs: bool = False
    """``include: [message.output_text.logprobs]``: token logprobs on the answer text."""
    top_logprobs: int = 0
    action_sources: bool = False
    """``include: [web_search_call.action.sources]``: each search's result URLs."""
    text_format: TextFormatEcho = field(default_factory=lambda: _PLAIN_TEXT)
    response_format: dict[str, Any] | None = None
    """``text.format`` in the chat form the head decodes with a grammar; None for text."""
    ignored: list[str] = field(default_factory=list)

    def sampling_extra(self) -> dict[str, Any]:
        """Fields relayed to the engine as on chat (vLLM's serving layer applies them)."""
        extra: dict[str, Any] = {}
        if self.logprobs:
            extra.update(logprobs=True, top_logprobs=self.top_logprobs)
        if self.response_format is not None:
            extra["response_format"] = self.response_format
        return extra


def read_options(
    body: ResponsesRequest, model: CatalogModel, *, structured_formats: bool = False
) -> ResponseOptions:
    """Check and translate the optional fields; 400 for what cannot be served.

    ``structured_formats``: the operator's switch (``responses.structured_text_formats``)
    that accepts ``text.format`` json_schema/json_object beyond the contract."""
    options = ResponseOptions()
    _read_include(body.include, options)
    if body.top_logprobs is not None:
        if options.logprobs:
            options.top_logprobs = body.top_logprobs
        else:  # OpenAI returns logprobs only with the include value
            options.ignored.append("top_logprobs")
    if body.background:
        raise _bad("background=true is not supported: responses are not queued.", "background")
    _read_text(body.text, model, options, structured_formats)
    if body.truncation == "auto":
        options.ignored.append("truncation")  # never cut: an over-long input is a 400
    if body.service_tier is not None and body.service_tier not in _TIERS_APPLIED:
        options.ignored.append("service_tier")
    if body.prompt_cache_key is not None:
        options.ignored.append("prompt_cache_key")
    if body.reasoning is not None and body.reasoning.summary is not None:
        options.ignored.append("reasoning.summary")
    return options


def _read_include(include: list[str] | None, options: ResponseOptions) -> None:
    for n, value in enumerate(include or []):
        if value not in INCLUDABLE:
            raise _bad(
                f"include value {value!r} is not supported; supported: "
                f"{', '.join(sorted(INCLUDABLE))}.",
                f"include[{n}]",
            )
        if value == "message.output_text.logprobs":
            options.logprobs = True
        elif value == "web_search_call.action.sources":
            options.action_sources = True
        # code_interpreter_call.outputs: every finished code call carries them anyway


def _read_text(
    text: dict[str, Any] | None,
    model: CatalogModel,
    options: ResponseOptions,
    structured_formats: bool,
) -> None:
    """``text.format`` (text; json_schema, json_object where the operator allows them) and
    ``text.verbosity``."""
    for key in text or {}:
        if key not in ("format", "verbosity"):
            raise _bad(f"text.{key} is not supported.", f"text.{key}")
    text = text or {}
    verbosity = text.get("verbosity")
    if verbosity is not None:
        if verbosity not in _VERBOSITY:
            raise _bad(
                "text.verbosity must be low, medium or high.", "text.verbosity", "invalid_value"
            )
        if verbosity != "medium":
            options.ignored.append("text.verbosity")  # the model's own length applies
    fmt = text.get("format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return
    if kind not in ("json_schema", "json_object"):
        raise _bad(
            "text.format.type must be text, json_schema or json_object.",
            "text.format",
            "invalid_value",
        )
    if not structured_formats:
        # The contract accepts only {format: {type: text}}; grammar-decoded formats are an
        # operator's extension (docs/reference/responses.md#request).
        raise _bad(
            f"text.format.type {kind!r} is not supported on /v1/responses: only 'text'.",
            "text.format",
        )
    if not honours_structured_outputs(model):
        raise _bad(
            f"The model '{model.id}' does not support structured outputs (text.format).",
            "text.format",
        )
    assert isinstance(fmt, dict)
    if kind == "json_object":
        options.text_format = {"type": "json_object"}
        options.response_format = {"type": "json_object"}
        return
    _json_schema(fmt, options)


def _json_schema(fmt: dict[str, Any], options: ResponseOptions) -> None:
    schema, name = fmt.get("schema"), fmt.get("name", "response")
    if not isinstance(schema, dict):
        raise _bad(
            "text.format.schema must be a JSON Schema object.",
            "text.format.schema",
            "invalid_value",
        )
    if not isinstance(name, str) or not name:
        raise _bad(
            "text.format.name must be a non-empty string.", "text.format.name", "invalid_value"
        )
    strict = fmt.get("strict")
    description = fmt.get("description")
    inner: dict[str, Any] = {"name": name, "schema": schema}
    if isinstance(description, str):
        inner["description"] = description
    if isinstance(strict, bool):
        inner["strict"] = strict
    options.response_format = {"type": "json_schema", "json_schema": inner}
    options.text_format = {
        "type": "json_schema",
        "name": name,
        "schema": schema,
        "description": description if isinstance(description, str) else None,
        "strict": strict if isinstance(strict, bool) else None,
    }
