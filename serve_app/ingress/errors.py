"""The one error mapper: every failure becomes the API's envelope (docs/reference/common.md).

Under ``/v1/messages`` (Anthropic's Messages API) the same errors are written in
Anthropic's envelope instead, with its types (docs/reference/messages.md#errors);
the choice is made here, by the request's path, for every source of an error.

Framework errors included: an unknown route is a 404, a wrong method a 405,
malformed JSON and schema violations a 400 (not FastAPI's 422) naming the
offending parameter in ``messages[0].role`` form.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.protocol.errors import (
    GatewayError,
    InvalidRequestError,
    MethodNotAllowedError,
    ModelUnavailableError,
    NotFoundError,
)
from serve_app.protocol.messages import anthropic_envelope, is_messages_path
from serve_app.protocol.validation import param_from_loc, validation_error
from serve_app.storage.db import UNREACHABLE_ERRORS

__all__ = [
    "database_unreachable_error",
    "error_response",
    "install_error_handlers",
    "param_from_loc",
    "validation_to_error",
]

logger = logging.getLogger(__name__)

_BODY_PARSE_FAILED = "There was an error parsing the body"
"""FastAPI's ``HTTPException`` detail when decoding a JSON body raised something other
than ``JSONDecodeError`` (``UnicodeDecodeError``, ``RecursionError``)."""


_RETRYABLE = (429, 503, 529)


def error_response(err: GatewayError, path: str | None = None) -> JSONResponse:
    """``err`` as the answer to a request for ``path`` (Anthropic's envelope under
    ``/v1/messages``, where a retryable status always carries ``retry-after``)."""
    if path is None or not is_messages_path(path):
        return JSONResponse(err.envelope(), status_code=err.status_code, headers=err.headers)
    headers = dict(err.headers)
    if err.status_code in _RETRYABLE and not any(k.lower() == "retry-after" for k in headers):
        headers["retry-after"] = "1"
    return JSONResponse(anthropic_envelope(err), status_code=err.status_code, headers=headers)


def database_unreachable_error() -> ModelUnavailableError:
    """503: an outage, not a bug: retryable, like a head that cannot take the call
    (docs/deployment.md, "Redis and database outages")."""
    return ModelUnavailableError(
        "The service cannot reach its database right now; retry shortly.",
        headers={"Retry-After": "1"},
    )


def validation_to_error(exc: RequestValidationError) -> InvalidRequestError:
    return validation_error(list(exc.errors()))


def install_error_handlers(app: FastAPI) -> None:
    async def on_gateway_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, GatewayError)
        return error_response(exc, request.url.path)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_to_error(exc), request.url.path)

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
        return error_response(err, request.url.path)

    async def on_database_unreachable(request: Request, exc: Exception) -> JSONResponse:
        logger.warning("database unreachable: %s", exc)
        return error_response(database_unreachable_error(), request.url.path)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=exc)
        return error_response(
            GatewayError("The server had an internal error.", code="internal_error"),
            request.url.path,
        )

    app.add_exception_handler(GatewayError, on_gateway_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    for unreachable in UNREACHABLE_ERRORS:
        app.add_exception_handler(unreachable, on_database_unreachable)
    app.add_exception_handler(Exception, on_unexpected)
