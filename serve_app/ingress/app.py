"""Assembly of the FastAPI app: routers, error mapping, body limit, metadata.

The order here is the request's path through the gateway: auth first (the
route's caller dependency on the headers, before any body byte; outermost) ->
body limit -> idempotency (replays a retried answer, to its caller only) ->
route -> auth dependency (the caller found first) -> service. ``create_app``
takes a ready ``GatewayState`` so tests build the same app without Ray.
"""

from __future__ import annotations

import functools

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute

from serve_app.dashboard import pages as dashboard_pages
from serve_app.ingress.auth_first import AuthFirstMiddleware
from serve_app.ingress.body_limit import BodyLimitMiddleware
from serve_app.ingress.docs_page import install_docs
from serve_app.ingress.errors import install_error_handlers
from serve_app.ingress.idempotency import IdempotencyMiddleware
from serve_app.ingress.methods import AllowedMethodsMiddleware
from serve_app.ingress.ratelimit_headers import RateLimitHeadersMiddleware
from serve_app.requests.openapi import install_openapi
from serve_app.requests.state import GatewayState
from serve_app.routes import (
    adapters,
    audio,
    batches,
    chat,
    completions,
    dashboard,
    dedicated,
    documents,
    embeddings,
    files,
    health,
    messages,
    models,
    responses,
    session,
    session_only,
    video,
)

API_VERSION = "1.0.0-m1"
STRICT_CONTENT_TYPE = False
"""A body sent without Content-Type is read as JSON (see ``create_app``)."""


@functools.cache
def api_routes() -> tuple[BaseRoute, ...]:
    """Every API route, built once per process and shared by the apps built in it.

    Including a router makes FastAPI build a pydantic adapter per parameter of every
    route (~0.3 s for this API); a server builds one app, but the tests build one per
    case. The routes hold no app state (handlers reach it through ``request.app``),
    and they are included with the app's own setting (``strict_content_type``).
    """
    router = APIRouter(strict_content_type=STRICT_CONTENT_TYPE)
    for module in (
        health,
        models,
        chat,
        completions,
        responses,
        messages,
        audio,
        documents,
        embeddings,
        video,
        files,
        batches,
        dedicated,
        adapters,
        session,
        dashboard,
        session_only,
        dashboard_pages,
    ):
        router.include_router(module.router)
    return tuple(router.routes)


def create_app(
    state: GatewayState, max_body_bytes: int, body_limits: dict[str, int] | None = None
) -> FastAPI:
    app = FastAPI(
        title="Inference Gateway",
        version=API_VERSION,
        docs_url=None,  # served from the package's files instead: install_docs
        redoc_url=None,
        # A body sent without Content-Type is read as JSON (clients that omit the header
        # get an answer, not "must be a JSON object"); other types are still not JSON.
        strict_content_type=STRICT_CONTENT_TYPE,
        description=(
            "OpenAI-compatible inference API. Authenticate with `Authorization: Bearer "
            "<key>`. Errors use the envelope `{error: {message, type, code, param}}`. "
            "Anthropic's Messages API is served under `/v1/messages` (key as `x-api-key` or "
            "Bearer; errors in Anthropic's envelope `{type: error, error: {type, message}}`)."
        ),
    )
    app.state.gateway = state
    app.router.routes.extend(api_routes())
    install_error_handlers(app)
    install_openapi(app)
    install_docs(app)
    # Inner to the body limit: a retry with an Idempotency-Key is answered from the
    # first attempt's stored answer, never generated (or billed) again.
    app.add_middleware(IdempotencyMiddleware, store=state.replays)
    # Outer to idempotency: a replayed answer was not admitted again and carries no
    # stale x-ratelimit-* headers of the first attempt.
    app.add_middleware(RateLimitHeadersMiddleware)
    app.add_middleware(AllowedMethodsMiddleware, router=app.router)
    limits = {
        **audio.body_limits(state.audio),
        **files.body_limits(state.files),
        **adapters.body_limits(state.adapters),
        **(body_limits or {}),
    }
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=max_body_bytes,
        limits=limits,
        streamed=audio.STREAMED_PATHS + files.STREAMED_PATHS + adapters.STREAMED_PATHS,
    )
    # Outermost of everything that reads the body: an unknown or revoked key is refused
    # before a byte of an upload is read, and a replay goes to its own caller only.
    app.add_middleware(AuthFirstMiddleware, router=app.router)
    return app
