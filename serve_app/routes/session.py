"""``/api/session`` and the one-time sign-in link (docs/reference/dashboard.md#session).

Thin: ``DashboardSessions`` signs in and out; this module only sets and clears the
``gw_session`` cookie (``HttpOnly``, ``SameSite=Lax``, ``Path=/``, ``Secure`` unless the
request came to localhost, where browsers accept plain HTTP).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse

from serve_app.auth.dashboard import SESSION_COOKIE
from serve_app.auth.sessions import Session
from serve_app.protocol.dashboard import (
    PasswordChangeRequest,
    SessionObject,
    SessionOrg,
    SessionUser,
    SignInRequest,
    SwitchOrgRequest,
)
from serve_app.protocol.errors import InvalidRequestError
from serve_app.requests.deps import Dashboard, SessionCaller
from serve_app.requests.openapi import ERROR_RESPONSES

router = APIRouter(tags=["dashboard session"])

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def session_object(session: Session) -> SessionObject:
    def org(o: object) -> SessionOrg:
        return SessionOrg.model_validate(o, from_attributes=True)

    return SessionObject(
        user=SessionUser(id=session.user_id, name=session.user_name),
        org=org(session.org),
        orgs=[org(o) for o in session.orgs],
        csrf_token=session.csrf_token,
        expires_at=int(session.expires_at.timestamp()),
    )


def _set_cookie(request: Request, response: Response, token: str, session: Session) -> None:
    max_age = int(session.expires_at.timestamp() - datetime.now(UTC).timestamp())
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=max(0, max_age),
        path="/",
        httponly=True,
        samesite="lax",
        secure=(request.url.hostname or "") not in LOCAL_HOSTS,
    )


def _client(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def _require_json(request: Request) -> None:
    """A sign-in has no session, hence no CSRF token: refusing anything but JSON keeps a
    cross-site form (which cannot send JSON without a CORS preflight) from posting it."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise InvalidRequestError(
            "Sign in with a JSON body (Content-Type: application/json).",
            code="unsupported_media_type",
            status_code=415,
        )


@router.post(
    "/api/session",
    response_model=SessionObject,
    responses=ERROR_RESPONSES,
    summary="Sign in to the dashboard with a user name and password",
)
async def sign_in(
    body: SignInRequest, request: Request, response: Response, dashboard: Dashboard
) -> SessionObject:
    _require_json(request)
    token, session = await dashboard.sessions.sign_in(
        body.username, body.password, _client(request)
    )
    _set_cookie(request, response, token, session)
    return session_object(session)


@router.get(
    "/api/session",
    response_model=SessionObject,
    responses=ERROR_RESPONSES,
    summary="The current dashboard session",
)
async def current_session(session: SessionCaller) -> SessionObject:
    return session_object(session)


@router.delete(
    "/api/session",
    status_code=204,
    response_class=Response,
    responses=ERROR_RESPONSES,
    summary="Sign out: the session ends on every replica",
)
async def sign_out(session: SessionCaller, dashboard: Dashboard) -> Response:
    await dashboard.sessions.sign_out(session)
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.post(
    "/api/session/org",
    response_model=SessionObject,
    responses=ERROR_RESPONSES,
    summary="Switch the session to another of the user's organizations",
)
async def switch_org(
    body: SwitchOrgRequest, session: SessionCaller, dashboard: Dashboard
) -> SessionObject:
    return session_object(await dashboard.sessions.switch_org(session, body.org_id))


@router.post(
    "/api/session/password",
    status_code=204,
    response_class=Response,
    responses=ERROR_RESPONSES,
    summary="Change the signed-in user's password (their other sessions end)",
)
async def change_password(
    body: PasswordChangeRequest, session: SessionCaller, dashboard: Dashboard
) -> Response:
    await dashboard.sessions.change_password(session, body.current_password, body.new_password)
    return Response(status_code=204)


@router.get(
    "/dashboard/login/token",
    response_class=RedirectResponse,
    status_code=303,
    responses=ERROR_RESPONSES,
    summary="Sign in with a one-time link printed by `gateway users login-link`",
)
async def sign_in_with_link(
    request: Request,
    dashboard: Dashboard,
    token: Annotated[str, Query(min_length=1, max_length=256)],
) -> RedirectResponse:
    raw, session = await dashboard.sessions.sign_in_with_link(token, _client(request))
    response = RedirectResponse("/dashboard", status_code=303)
    _set_cookie(request, response, raw, session)
    return response
