"""The console's pages over HTTP, no browser: what ships, what a visitor without a
session gets, and that nothing is loaded from outside the gateway."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest

from serve_app.dashboard import pages
from tests.fixtures.dashboard import PASSWORD, signed_in
from tests.fixtures.gateway import GatewayHarness

PACKAGE = Path(pages.__file__).parent
REPO = PACKAGE.parents[1]


def _shipped_files() -> list[str]:
    return [
        str(p.relative_to(PACKAGE))
        for folder in ("templates", "static")
        for p in (PACKAGE / folder).iterdir()
        if p.is_file()
    ]


def test_the_wheel_ships_every_template_and_asset() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["serve_app.dashboard"]
    missing = [f for f in _shipped_files() if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert missing == []


def test_nothing_is_loaded_from_another_origin() -> None:
    """No CDN: the only absolute URL in the console is the SVG namespace it draws in."""
    allowed = {"http://www.w3.org/2000/svg"}
    for name in _shipped_files():
        text = (PACKAGE / name).read_text()
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"'`)]*", text))
        assert urls <= allowed, (name, urls - allowed)


def test_every_page_script_exists() -> None:
    for page in pages.PAGES:
        assert (PACKAGE / "templates" / f"{page.slug}.html").is_file()
        assert page.script in pages.assets()


@pytest.mark.parametrize("slug", [p.slug for p in pages.PAGES])
async def test_a_page_without_a_session_sends_to_sign_in(
    sync_gateway: GatewayHarness, slug: str
) -> None:
    async with sync_gateway.client() as http:
        answer = await http.get(f"/dashboard/{slug}")
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/dashboard/login?next=/dashboard/{slug}"


async def test_sign_in_page_forbids_framing_and_foreign_scripts(
    sync_gateway: GatewayHarness,
) -> None:
    async with sync_gateway.client() as http:
        answer = await http.get("/dashboard/login")
        assert answer.status_code == 200
        policy = answer.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert answer.headers["x-frame-options"] == "DENY"
        for src in re.findall(r'(?:src|href)="(/[^"]+)"', answer.text):
            assert (await http.get(src)).status_code in (200, 303), src


@pytest.mark.parametrize(
    "path", ["/dashboard/static/missing.js", "/dashboard/static/..%2Fpages.py", "/dashboard/nope"]
)
async def test_unknown_files_are_not_found(sync_gateway: GatewayHarness, path: str) -> None:
    async with sync_gateway.client() as http:
        answer = await http.get(path)
    assert answer.status_code == 404
    assert "def " not in answer.text


async def test_the_account_page_is_every_users_and_changes_their_password(
    sync_gateway: GatewayHarness,
) -> None:
    """A member gets the page (and it is in their navigation); its form posts where the
    API changes the password, with the session's CSRF token like every write."""
    sync_gateway.store.set_membership("erin", "acme", "member")
    async with signed_in(sync_gateway, "erin") as http:
        page = await http.get("/dashboard/account")
        assert page.status_code == 200
        assert '<a href="/dashboard/account" aria-current="page">Your account</a>' in page.text
        assert 'id="password-form"' in page.text and 'autocomplete="new-password"' in page.text
        keys_page = await http.get("/dashboard/keys")
        assert 'href="/dashboard/account"' in keys_page.text
        change = {"current_password": PASSWORD, "new_password": "another long password"}
        token = http.headers.pop("X-CSRF-Token")
        refused = await http.post("/api/session/password", json=change)
        assert refused.json()["error"]["code"] == "csrf_failed"
        http.headers["X-CSRF-Token"] = token
        assert (await http.post("/api/session/password", json=change)).status_code == 204
        assert (await http.get("/dashboard/account")).status_code == 200  # still signed in
    script = pages.assets()["account.js"].body.decode()
    assert '"/api/session/password"' in script
