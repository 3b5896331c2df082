"""Assembly of the FastAPI app: routers, error mapping, body limit, metadata.

The order here is the request's path through the gateway: body limit (outer
middleware) -> idempotency (replays a retried answer) -> route -> auth
dependency -> service. ``create_app`` takes a ready ``GatewayState`` so tests
build the same app without Ray.
"""

from __future__ import annotations

from fastapi import FastAPI

from serve_app.ingress.body_limit import BodyLimitMiddleware
from serve_app.ingress.errors import install_error_handlers
from serve_app.ingress.idempotency import IdempotencyMiddleware
from serve_app.ingress.methods import AllowedMethodsMiddleware
from serve_app.ingress.openapi import install_openapi
from serve_app.ingress.ratelimit_headers import RateLimitHeadersMiddleware
from serve_app.ingress.state import GatewayState
from serve_app.routes import (
    adapters,
    audio,
    batches,
    chat,
    completions,
    dedicated,
    document,
    embeddings,
    files,
    health,
    models,
    responses,
    session_only,
    video,
)

API_VERSION = "1.0.0-m1"


def create_app(
    state: GatewayState, max_body_bytes: int, body_limits: dict[str, int] | None = None
) -> FastAPI:
    app = FastAPI(
        title="Inference Gateway",
        version=API_VERSION,
        # A body sent without Content-Type is read as JSON (clients that omit the header
        # get an answer, not "must be a JSON object"); other types are still not JSON.
        strict_content_type=False,
        description=(
            "OpenAI-compatible inference API. Authenticate with `Authorization: Bearer "
            "<key>`. Errors use the envelope `{error: {message, type, code, param}}`."
        ),
    )
    app.state.gateway = state
    for module in (
        health,
        models,
        chat,
        completions,
        responses,
        audio,
        document,
        embeddings,
        video,
        files,
        batches,
        dedicated,
        adapters,
        session_only,
    ):
        app.include_router(module.router)
    install_error_handlers(app)
    install_openapi(app)
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
    return app
