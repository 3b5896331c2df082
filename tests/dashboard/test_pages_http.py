"""The console's pages over HTTP, no browser: what ships, what a visitor without a
session gets, and that nothing is loaded from outside the gateway."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest

from serve_app.dashboard import pages
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
