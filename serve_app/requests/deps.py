"""Typed FastAPI dependencies: the caller and the gateway state.

The caller dependencies here are the one place that authenticates. FastAPI runs
dependencies only after it has read the body (a multipart upload, spooled whole),
so ``AuthFirstMiddleware`` (``serve_app.ingress.auth_first``) calls the route's caller
dependencies (those in ``PRE_BODY_CALLERS``) on the headers alone before any body byte
is read, and leaves the caller in the ASGI scope; the route's own call takes it from
there instead of looking the key up again. A caller dependency therefore reads
headers only and takes the request alone.

One authentication dependency serves every route: an ``Authorization`` header is an API
key (``serve_app.auth.service``); without one, the dashboard's session cookie is read
(``serve_app.auth.dashboard``), and its principal is the session's user in its current
organization with every scope. A write made with the cookie must carry the session's
CSRF token. Session-only routes (``session_caller``) take only the cookie: an API key
there is 403 ``session_required``.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from serve_app.auth.dashboard import CSRF_HEADER, SESSION_COOKIE, not_signed_in, require_csrf
from serve_app.auth.principal import SCOPE_DEDICATED, SCOPE_INFERENCE, Principal
from serve_app.auth.sessions import Session
from serve_app.protocol.errors import PermissionDeniedError
from serve_app.requests.state import DashboardServices, GatewayState


async def get_state(request: Request) -> GatewayState:
    # async on purpose: FastAPI runs plain ``def`` dependencies in a thread pool.
    state: GatewayState = request.app.state.gateway
    return state


State = Annotated[GatewayState, Depends(get_state)]


PRINCIPAL_SCOPE_KEY = "gateway.principal"
"""Where the ASGI scope carries the caller authenticated before the body:
``(Principal, time.monotonic() when verified)``."""

PRE_BODY_REUSE_S = 1.0
"""How long a caller verified before the body stays good for the route: a body that
took longer to arrive (a large upload) is followed by a fresh check, so a key revoked
while it was being sent is refused."""


def known_caller(scope: Scope) -> Principal | None:
    """The caller this request was authenticated as, if it already was."""
    known = scope.get(PRINCIPAL_SCOPE_KEY)
    return None if known is None else known[0]


async def _authenticate(request: Request) -> Principal:
    return await _authenticated_as(request, request.headers.get("authorization"))


async def _authenticated_as(request: Request, header: str | None) -> Principal:
    """The caller ``header`` names, verified once per request (see ``PRE_BODY_REUSE_S``)."""
    known = request.scope.get(PRINCIPAL_SCOPE_KEY)
    if known is not None and time.monotonic() - known[1] < PRE_BODY_REUSE_S:
        principal: Principal = known[0]
        return principal
    principal = await _verify(request, header)
    request.scope[PRINCIPAL_SCOPE_KEY] = (principal, time.monotonic())
    return principal


async def dashboard_services(request: Request) -> DashboardServices:
    state: GatewayState = request.app.state.gateway
    if state.dashboard is None:
        raise not_signed_in()
    return state.dashboard


SESSION_SCOPE_KEY = "gateway.session"
"""Where the ASGI scope carries the session found before the body, as
``PRINCIPAL_SCOPE_KEY`` carries a key's caller: ``(Session, time.monotonic())``."""


async def _session(request: Request) -> Session:
    """The request's live session (401 ``invalid_session``), CSRF checked on writes; read
    once per request (``AuthFirstMiddleware`` finds it first when the request has a body)."""
    known = request.scope.get(SESSION_SCOPE_KEY)
    if known is not None and time.monotonic() - known[1] < PRE_BODY_REUSE_S:
        session: Session = known[0]
    else:
        session = await (await dashboard_services(request)).sessions.current(
            request.cookies.get(SESSION_COOKIE)
        )
        request.scope[SESSION_SCOPE_KEY] = (session, time.monotonic())
    require_csrf(session, request.method, request.headers.get(CSRF_HEADER))
    request.state.session = session
    return session


async def _verify(request: Request, header: str | None) -> Principal:
    if header is None and SESSION_COOKIE in request.cookies:
        return (await _session(request)).principal
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


UPLOAD_FRAMING_BYTES = 64 * 1024
"""What of an upload's declared ``Content-Length`` may be multipart framing and form fields
rather than the stored file (a few hundred bytes in practice)."""
STORAGE_CHECKED_KEY = "gateway.storage_checked"
"""Set in the ASGI scope once ``uploading_caller`` has checked the organization's room."""


async def uploading_caller(request: Request) -> Principal:
    """An ``inference`` caller whose upload the organization will store (``/v1/files``,
    ``/api/adapters``): 403 ``storage_quota_exceeded`` from the headers alone, before any
    body byte is read (``AuthFirstMiddleware`` runs it), when the organization is already
    at a storage bound or when the declared ``Content-Length`` alone would pass it. The
    service checks the exact size again once the file is read."""
    principal = await inference_caller(request)
    if STORAGE_CHECKED_KEY not in request.scope:
        state: GatewayState = request.app.state.gateway
        declared = request.headers.get("content-length", "")
        known = declared.isdigit() and len(declared) <= 18  # else the body limit's to refuse
        at_least = int(declared) - UPLOAD_FRAMING_BYTES if known else 0
        await run_in_threadpool(
            state.files.quotas.check_declared, principal.org_id, max(1, at_least)
        )
        request.scope[STORAGE_CHECKED_KEY] = True
    return principal


UploadingCaller = Annotated[Principal, Depends(uploading_caller)]


async def messages_caller(request: Request) -> Principal:
    """An ``inference`` caller as Anthropic clients authenticate: ``x-api-key: <key>``, or
    ``Authorization: Bearer <key>`` (docs/reference/messages.md#authentication)."""
    header = request.headers.get("authorization")
    api_key = request.headers.get("x-api-key")
    if not header and api_key:
        header = f"Bearer {api_key}"
    principal = await _authenticated_as(request, header)
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


def session_required() -> PermissionDeniedError:
    return PermissionDeniedError(
        "This operation needs a dashboard session; API keys cannot perform it.",
        code="session_required",
    )


async def session_caller(request: Request) -> Session:
    """A dashboard session, for the session-only routes
    (docs/reference/common.md#scopes-and-session-only-routes): an API key is 403
    ``session_required`` (a bad one 401 first), no credential 401."""
    if request.headers.get("authorization") is not None:
        await _authenticate(request)
        raise session_required()
    return await _session(request)


SessionCaller = Annotated[Session, Depends(session_caller)]


async def admin_session(session: SessionCaller) -> Session:
    """An organization admin's session (403 ``insufficient_permissions`` otherwise)."""
    if session.org.role != "admin":
        raise PermissionDeniedError(
            "Only an organization admin may do this.", code="insufficient_permissions"
        )
    return session


AdminSession = Annotated[Session, Depends(admin_session)]
Dashboard = Annotated[DashboardServices, Depends(dashboard_services)]


PRE_BODY_CALLERS = frozenset(
    {
        _authenticate,
        inference_caller,
        uploading_caller,
        messages_caller,
        dedicated_caller,
        session_caller,
    }
)
"""The caller dependencies ``AuthFirstMiddleware`` runs before the body is read."""
