"""The OpenAPI document: the error envelope on every route, and what the generator misses.

The published document must state exactly what the server accepts (issue 16:
a fuzzer reading it must find no schema-valid request refused and no
schema-invalid one accepted). Most of that lives on the protocol models
(``minItems``, integer types, ``additionalProperties``); ``tighten`` fixes what
FastAPI's generator cannot express from them.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from serve_app.protocol.errors import ErrorEnvelope
from serve_app.protocol.messages import AnthropicErrorEnvelope

_STATUSES = {
    400: "Invalid request",
    401: "Missing, malformed, unknown or revoked key",
    403: "Not allowed for this key, user or organization",
    404: "Unknown model or resource",
    413: "Body larger than the limit",
    429: "Rate limit or quota",
    502: "Upstream error",
    503: "Model unavailable or warming (Retry-After)",
    504: "Upstream timeout",
}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorEnvelope, "description": text} for status, text in _STATUSES.items()
}

ANTHROPIC_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": AnthropicErrorEnvelope, "description": text}
    for status, text in _STATUSES.items()
}
"""The same statuses in Anthropic's envelope (the ``/v1/messages`` routes)."""


def install_openapi(app: FastAPI) -> None:
    """Serve FastAPI's document with the corrections below (cached after the first build)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = tighten(document)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def tighten(document: dict[str, Any]) -> dict[str, Any]:
    """Make the document say what the server accepts where FastAPI's generator cannot.

    - Bounds: pydantic writes ``ge``/``gt``/``le``/``lt`` (not JSON Schema keywords,
      so every reader ignores them) for a bound on a type with a before-validator
      (``JsonInt``, ``WholeInt``): they become ``minimum``, ``exclusiveMinimum``...
    - A multipart form cannot carry JSON ``null``: FastAPI publishes an optional
      form field as ``anyOf: [T, null]``, and a client that sends the string
      ``null`` (or nothing in a part) gets a 400. Optional form fields are
      published as plain ``T`` (leave the part out instead).
    """
    _standard_bounds(document)
    schemas = document.get("components", {}).get("schemas", {})
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict):
                continue
            content = operation.get("requestBody", {}).get("content", {})
            form = content.get("multipart/form-data", {}).get("schema")
            if form is None:
                continue
            target = _resolve(form, schemas)
            for name, prop in list(target.get("properties", {}).items()):
                target["properties"][name] = _without_null(prop)
    return document


_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def _standard_bounds(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _standard_bounds(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") in ("integer", "number"):
        for short, keyword in _BOUNDS.items():
            value = node.get(short)
            if isinstance(value, int | float) and not isinstance(value, bool):
                node[keyword] = node.pop(short)
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            for prop in value.values():
                _standard_bounds(prop)
        else:
            _standard_bounds(value)


def _resolve(schema: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        resolved: dict[str, Any] = schemas[ref.rsplit("/", 1)[-1]]
        return resolved
    return schema


def _without_null(prop: dict[str, Any]) -> dict[str, Any]:
    options = prop.get("anyOf")
    if not isinstance(options, list):
        return prop
    kept = [o for o in options if o.get("type") != "null"]
    if len(kept) != 1:
        return prop
    merged = {k: v for k, v in prop.items() if k != "anyOf"}
    merged.update(kept[0])
    return merged
