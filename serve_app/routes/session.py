"""``/api/session``, the one-time sign-in link and OpenID Connect sign-in
(docs/reference/dashboard.md#session).

Thin: ``DashboardSessions`` signs in and out; this module only sets and clears the
``gw_session`` cookie (``HttpOnly``, ``SameSite=Lax``, ``Path=/``, ``Secure`` unless the
request came to localhost, where browsers accept plain HTTP), and the OpenID Connect
flow's own cookie (``gw_oidc``: the same flags, ten minutes, only sent to
``/api/session/oidc``). The OpenID Connect routes are browser navigations, not API
calls: a refused sign-in returns to the sign-in page with a fixed error code it explains
(never the provider's text, which anyone could put in a link), and the reason is logged.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse

from serve_app.auth.dashboard import SESSION_COOKIE
from serve_app.auth.oidc import FLOW_TTL_S, OidcError
from serve_app.auth.sessions import Session
from serve_app.protocol.dashboard import (
    PasswordChangeRequest,
    SessionObject,
    SessionOrg,
    SessionUser,
    SignInRequest,
    SwitchOrgRequest,
)
from serve_app.protocol.errors import GatewayError, InvalidRequestError, NotFoundError
from serve_app.requests.deps import Dashboard, SessionCaller
from serve_app.requests.openapi import ERROR_RESPONSES

logger = logging.getLogger(__name__)

router = APIRouter(tags=["dashboard session"])

OIDC_COOKIE = "gw_oidc"
OIDC_PATH = "/api/session/oidc"
_CONSOLE_PATH = re.compile(r"/dashboard(/[a-z-]*)?")

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


def _secure(request: Request) -> bool:
    return (request.url.hostname or "") not in LOCAL_HOSTS


def _set_cookie(request: Request, response: Response, token: str, session: Session) -> None:
    max_age = int(session.expires_at.timestamp() - datetime.now(UTC).timestamp())
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=max(0, max_age),
        path="/",
        httponly=True,
        samesite="lax",
        secure=_secure(request),
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


# ---- OpenID Connect ----------------------------------------------------------------
def _to_sign_in(code: str) -> RedirectResponse:
    return RedirectResponse(f"/dashboard/login?{urlencode({'oidc_error': code})}", 303)


@router.get(
    f"{OIDC_PATH}/start",
    response_class=RedirectResponse,
    status_code=303,
    responses=ERROR_RESPONSES,
    summary="Sign in through the configured OpenID Connect provider (a browser navigation)",
)
async def oidc_start(
    request: Request,
    dashboard: Dashboard,
    next_path: Annotated[str | None, Query(alias="next", max_length=200)] = None,
) -> RedirectResponse:
    oidc = dashboard.sessions.oidc
    if oidc is None:
        raise NotFoundError("No OpenID Connect provider is configured.", code="oidc_not_configured")
    target = next_path if next_path and _CONSOLE_PATH.fullmatch(next_path) else "/dashboard"
    redirect_uri = oidc.client.options.redirect_uri or str(request.url_for("oidc_callback"))
    try:
        url, sealed = await oidc.client.begin(redirect_uri, target)
    except OidcError as exc:
        logger.warning("OIDC sign-in not started (%s): %s", exc.code, exc.reason)
        return _to_sign_in(exc.code)
    response = RedirectResponse(url, status_code=303)
    response.set_cookie(
        OIDC_COOKIE,
        sealed,
        max_age=FLOW_TTL_S,
        path=OIDC_PATH,
        httponly=True,
        samesite="lax",  # sent on the provider's top-level redirect back, not on a POST
        secure=_secure(request),
    )
    return response


@router.get(
    f"{OIDC_PATH}/callback",
    response_class=RedirectResponse,
    status_code=303,
    responses=ERROR_RESPONSES,
    summary="Where the OpenID Connect provider returns: starts the dashboard session",
)
async def oidc_callback(request: Request, dashboard: Dashboard) -> RedirectResponse:
    try:
        raw, session, target = await dashboard.sessions.sign_in_with_oidc(
            request.cookies.get(OIDC_COOKIE), dict(request.query_params), _client(request)
        )
    except OidcError as exc:
        logger.warning("OIDC sign-in refused (%s): %s", exc.code, exc.reason)
        response = _to_sign_in(exc.code)
    except GatewayError as exc:  # rate limited, or a user in no organization
        logger.warning("OIDC sign-in refused (%s): %s", exc.code, exc.message)
        response = _to_sign_in(exc.code or "refused")
    else:
        response = RedirectResponse(target, status_code=303)
        _set_cookie(request, response, raw, session)
    response.delete_cookie(OIDC_COOKIE, path=OIDC_PATH, httponly=True, samesite="lax")
    return response
