"""Who is looking at a page: the session the JSON API sees for the request's cookie.

A page is only a shell (its data comes from the API, which checks every call), but a
member should not be handed an admin page at all, and a visitor without a session is
sent to sign in. The viewer is asked of ``GET /api/session`` itself, in process, with the
request's cookie: the pages trust exactly what the API decides, and keep no session
logic of their own that could drift from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import Request

SESSION_COOKIE = "gw_session"


@dataclass(frozen=True)
class PageViewer:
    user_name: str
    org_name: str
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


async def page_viewer(request: Request) -> PageViewer | None:
    """The signed-in viewer, or None (no cookie, or a session the API does not accept)."""
    cookie = request.cookies.get(SESSION_COOKIE)
    if not cookie:
        return None
    transport = httpx.ASGITransport(app=request.app)
    base = f"{request.url.scheme}://{request.url.netloc}"
    async with httpx.AsyncClient(transport=transport, base_url=base) as client:
        answer = await client.get("/api/session", cookies={SESSION_COOKIE: cookie})
    if answer.status_code != 200:
        return None
    body: dict[str, Any] = answer.json()
    return PageViewer(
        user_name=str(body["user"]["name"]),
        org_name=str(body["org"]["name"]),
        role=str(body["org"]["role"]),
    )
