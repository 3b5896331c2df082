"""The other spellings of the session-only areas
(docs/reference/common.md#scopes-and-session-only-routes).

Credential, organization, billing and admin operations are session-only. Their routes
are ``serve_app.routes.dashboard`` and ``serve_app.routes.session``; any other path in
those areas, under any usual spelling, answers as they would to the credential sent: an
API key gets 403 ``session_required``, no credential 401, and a dashboard session 404
(no such route).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.routing import APIRoute
from starlette.routing import Match

from serve_app.protocol.errors import MethodNotAllowedError, NotFoundError
from serve_app.requests.deps import session_caller

router = APIRouter(prefix="/api", tags=["dashboard (session only)"])

# The API names the kinds of operation (credentials, organization, billing, admin),
# not their paths: the usual spellings of each are all refused the same way.
SESSION_ONLY_AREAS = (
    "keys",
    "api-keys",
    "api_keys",
    "credentials",
    "orgs",
    "org",
    "organizations",
    "organization",
    "members",
    "users",
    "billing",
    "invoices",
    "admin",
)
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def _declared_elsewhere(request: Request) -> bool:
    """Whether a declared route has this path (with other methods: this one got here)."""
    return any(
        isinstance(route, APIRoute)
        and route.include_in_schema
        and route.matches(request.scope)[0] != Match.NONE
        for route in request.app.router.routes
    )


async def session_only(request: Request) -> None:
    if _declared_elsewhere(request):
        raise MethodNotAllowedError(f"Method {request.method} not allowed on this path.")
    await session_caller(request)
    raise NotFoundError(f"No route {request.url.path}.", code="unknown_route")


for _area in SESSION_ONLY_AREAS:
    router.add_api_route(f"/{_area}", session_only, methods=_METHODS, include_in_schema=False)
    router.add_api_route(
        f"/{_area}/{{rest:path}}", session_only, methods=_METHODS, include_in_schema=False
    )
