"""Dashboard operations that need a browser session
(docs/reference/common.md#scopes-and-session-only-routes).

Credential, organization, billing and admin operations are session-only. The
gateway has no session login yet, so an API key reaching them gets 403
``session_required`` and a request with no key gets 401; nothing else happens.
"""

from __future__ import annotations

from fastapi import APIRouter

from serve_app.ingress.deps import AnyCaller
from serve_app.protocol.errors import PermissionDeniedError

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


async def session_only(caller: AnyCaller) -> None:
    raise PermissionDeniedError(
        "This operation needs a dashboard session; API keys cannot perform it.",
        code="session_required",
    )


for _area in SESSION_ONLY_AREAS:
    router.add_api_route(f"/{_area}", session_only, methods=_METHODS, include_in_schema=False)
    router.add_api_route(
        f"/{_area}/{{rest:path}}", session_only, methods=_METHODS, include_in_schema=False
    )
