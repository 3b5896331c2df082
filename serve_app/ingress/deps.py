"""Typed FastAPI dependencies: the caller and the gateway state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from serve_app.auth.principal import SCOPE_DEDICATED, SCOPE_INFERENCE, Principal
from serve_app.ingress.state import GatewayState
from serve_app.protocol.errors import PermissionDeniedError


async def get_state(request: Request) -> GatewayState:
    # async on purpose: FastAPI runs plain ``def`` dependencies in a thread pool.
    state: GatewayState = request.app.state.gateway
    return state


State = Annotated[GatewayState, Depends(get_state)]


async def _authenticate(request: Request) -> Principal:
    return await _authenticate_header(request, request.headers.get("authorization"))


async def _authenticate_header(request: Request, header: str | None) -> Principal:
    state: GatewayState = request.app.state.gateway
    await state.auth.refresh()  # a revocation anywhere drops this replica's cache first
    principal = state.auth.cached(header)
    if principal is not None:
        return principal
    # A cache miss may hit the database: keep it off the event loop.
    return await run_in_threadpool(state.auth.authenticate, header)


async def inference_caller(request: Request) -> Principal:
    """A caller allowed on ``/v1`` routes (docs/reference/common.md#authentication)."""
    principal = await _authenticate(request)
    if SCOPE_INFERENCE not in principal.scopes:
        raise PermissionDeniedError(
            "This key is not granted the 'inference' scope.", code="insufficient_scope"
        )
    return principal


InferenceCaller = Annotated[Principal, Depends(inference_caller)]


async def messages_caller(request: Request) -> Principal:
    """An ``inference`` caller as Anthropic clients authenticate: ``x-api-key: <key>``, or
    ``Authorization: Bearer <key>`` (docs/reference/messages.md#authentication)."""
    header = request.headers.get("authorization")
    api_key = request.headers.get("x-api-key")
    if not header and api_key:
        header = f"Bearer {api_key}"
    principal = await _authenticate_header(request, header)
    if SCOPE_INFERENCE not in principal.scopes:
        raise PermissionDeniedError(
            "This key is not granted the 'inference' scope.", code="insufficient_scope"
        )
    return principal


MessagesCaller = Annotated[Principal, Depends(messages_caller)]


async def dedicated_caller(request: Request) -> Principal:
    """A caller allowed on ``/api/dedicated`` routes (scope ``dedicated``)."""
    principal = await _authenticate(request)
    if SCOPE_DEDICATED not in principal.scopes:
        raise PermissionDeniedError(
            "This key is not granted the 'dedicated' scope.", code="insufficient_scope"
        )
    return principal


DedicatedCaller = Annotated[Principal, Depends(dedicated_caller)]
AnyCaller = Annotated[Principal, Depends(_authenticate)]
