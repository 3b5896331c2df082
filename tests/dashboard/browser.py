"""What the browser tests do alike: watch a page for errors and stray requests, sign in,
save screenshots for docs/dashboard.md."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image
from playwright.sync_api import Page, Request, expect

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "dashboard"


@dataclass
class PageWatch:
    """Script errors and every request that left the gateway's origin (the console must
    work offline: nothing may come from a CDN)."""

    origin: str
    errors: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    def attach(self, page: Page) -> None:
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("request", self._request)

    def _request(self, request: Request) -> None:
        if not request.url.startswith((self.origin, "data:", "blob:")):
            self.foreign.append(request.url)

    def assert_clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.foreign == [], self.foreign


def sign_in(page: Page, url: str, username: str, password: str) -> None:
    page.goto(f"{url}/dashboard/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{url}/dashboard/keys")


def screenshot(page: Page, name: str) -> None:
    """Save the page when ``GATEWAY_DASHBOARD_SCREENSHOTS`` is set (docs/dashboard.md)."""
    if os.environ.get("GATEWAY_DASHBOARD_SCREENSHOTS"):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = Image.open(io.BytesIO(page.screenshot(full_page=True)))
        # 64 colours are plenty for a console of flat colours, at a third of the bytes.
        shot.quantize(colors=64).save(SCREENSHOTS / f"{name}.png", optimize=True)


def assert_fits_narrow(page: Page, width: int = 360) -> None:
    """Readable on a narrow window: only tables scroll sideways, never the page."""
    page.set_viewport_size({"width": width, "height": 740})
    overflow = "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    assert page.evaluate(overflow) <= 0
