"""The dashboard's page routes: HTML shells and their static assets (docs/dashboard.md).

Each page is a server-rendered template; its data comes from the same JSON API every
other client uses (``/api/...`` and ``/v1/...``), called by the page's script with the
session cookie and the ``X-CSRF-Token`` header. So the console never reads a store: what
a page shows is what the API lets its user see, and a refused call shows the API's own
message. Templates and assets ship in the package (no CDN, no front-end build): the
console works on a private network and is readable without a JavaScript toolchain.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from urllib.parse import urlencode

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from serve_app.dashboard.guard import PageViewer, page_viewer

router = APIRouter(prefix="/dashboard", include_in_schema=False)


@dataclass(frozen=True)
class Page:
    slug: str
    title: str
    script: str
    admin_only: bool = False


PAGES = (
    Page("keys", "API keys", "keys.js"),
    Page("usage", "Usage and spend", "usage.js"),
    Page("members", "Members and flags", "members.js", admin_only=True),
    Page("dedicated", "Dedicated endpoints", "dedicated.js"),
    Page("batches", "Batches and files", "batches.js"),
    Page("adapters", "Adapters", "adapters.js"),
    Page("playground", "Playground", "playground.js"),
    Page("account", "Your account", "account.js"),
)

_CONTENT_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
# Pages run only their own scripts and styles: no inline script, nothing from elsewhere,
# never framed (a framed console could be clicked through by another site).
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    version: str


@functools.cache
def assets() -> dict[str, Asset]:
    """The static files, read once from the package (a wheel ships them as package data)."""
    found: dict[str, Asset] = {}
    for entry in (resources.files("serve_app.dashboard") / "static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _CONTENT_TYPES:
            body = entry.read_bytes()
            version = hashlib.sha256(body).hexdigest()[:12]
            found[entry.name] = Asset(body, _CONTENT_TYPES[suffix], version)
    return found


def static_url(name: str) -> str:
    """An asset's URL carrying its content hash, so a new release is never served stale."""
    return f"/dashboard/static/{name}?v={assets()[name].version}"


@functools.cache
def templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("serve_app.dashboard", "templates"),
        autoescape=jinja2.select_autoescape(default=True),
        undefined=jinja2.StrictUndefined,
    )
    env.globals["static_url"] = static_url
    return env


def render(template: str, status: int = 200, **context: object) -> HTMLResponse:
    html = templates().get_template(template).render(**context)
    return HTMLResponse(html, status_code=status, headers=_PAGE_HEADERS)


@router.get("/static/{name}")
async def static_file(name: str) -> Response:
    asset = assets().get(name)
    if asset is None:
        return Response("not found", status_code=404, media_type="text/plain")
    return Response(
        asset.body,
        media_type=asset.content_type,
        headers={"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"},
    )


@router.get("")
async def home(request: Request) -> Response:
    viewer = await page_viewer(request)
    target = "/dashboard/keys" if viewer is not None else "/dashboard/login"
    return RedirectResponse(target, status_code=303)


_CONSOLE_PATH = re.compile(r"/dashboard(/[a-z-]*)?")


@router.get("/login")
async def login_page(request: Request) -> HTMLResponse:
    """The sign-in form, and the OpenID Connect provider's button when one is configured
    (its link carries the page to return to, checked to be a console page)."""
    provider = _oidc_provider(request)
    oidc_href = None
    if provider is not None:
        next_page = request.query_params.get("next", "")
        query = f"?{urlencode({'next': next_page})}" if _CONSOLE_PATH.fullmatch(next_page) else ""
        oidc_href = f"/api/session/oidc/start{query}"
    return render(
        "login.html", title="Sign in", script="login.js", provider=provider, oidc_href=oidc_href
    )


def _oidc_provider(request: Request) -> str | None:
    """The configured provider's name, read from the sign-in service the API uses."""
    dashboard = getattr(getattr(request.app.state, "gateway", None), "dashboard", None)
    oidc = getattr(getattr(dashboard, "sessions", None), "oidc", None)
    return None if oidc is None else str(oidc.client.name)


def _page_route(page: Page) -> Callable[[Request], Awaitable[Response]]:
    async def show(request: Request) -> Response:
        viewer = await page_viewer(request)
        if viewer is None:
            return RedirectResponse(f"/dashboard/login?next=/dashboard/{page.slug}", 303)
        if page.admin_only and not viewer.is_admin:
            return _forbidden(page, viewer)
        return render(
            f"{page.slug}.html", page=page, pages=_nav(viewer), viewer=viewer, title=page.title
        )

    show.__name__ = f"page_{page.slug}"
    return show


def _forbidden(page: Page, viewer: PageViewer) -> HTMLResponse:
    return render(
        "forbidden.html",
        status=403,
        page=page,
        pages=_nav(viewer),
        viewer=viewer,
        title="Not available",
    )


def _nav(viewer: PageViewer) -> list[Page]:
    """The pages a viewer may open: a member is never shown the admins' pages."""
    return [page for page in PAGES if viewer.is_admin or not page.admin_only]


for _page in PAGES:
    router.add_api_route(f"/{_page.slug}", _page_route(_page), methods=["GET"])
