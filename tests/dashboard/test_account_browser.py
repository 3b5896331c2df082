"""Your account and OpenID Connect sign-in in chromium: a password changed in the page ends
the user's other sessions and keeps this one; the provider's button signs in through a
provider on a local port (tests/fixtures/oidc_provider.py) and back to the console."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.dashboard.browser import PageWatch, screenshot, sign_in
from tests.dashboard.conftest import LiveGateway, serving
from tests.fixtures.dashboard import PASSWORD
from tests.fixtures.gateway import build_harness, start_heads
from tests.fixtures.oidc_provider import (
    CLIENT_ID,
    CLIENT_SECRET,
    FakeProvider,
    running_provider,
)

NEW_PASSWORD = "a new and longer passphrase"


def _password_sign_in(url: str, password: str) -> httpx.Client:
    http = httpx.Client(base_url=url)
    answer = http.post("/api/session", json={"username": "erin", "password": password})
    assert answer.status_code == 200, answer.text
    return http


def test_a_password_changed_in_the_page_ends_the_other_sessions(
    page: Page, live_gateway: LiveGateway
) -> None:
    live_gateway.user("erin", "acme", "member")
    elsewhere = _password_sign_in(live_gateway.url, PASSWORD)  # another machine's session
    watch = PageWatch(live_gateway.url)
    watch.attach(page)
    sign_in(page, live_gateway.url, "erin", PASSWORD)
    page.get_by_role("navigation").get_by_role("link", name="Your account").click()
    expect(page).to_have_url(f"{live_gateway.url}/dashboard/account")

    page.get_by_label("Current password").fill("not my password")
    page.get_by_label("New password", exact=True).fill(NEW_PASSWORD)
    page.get_by_label("New password, again").fill(NEW_PASSWORD)
    page.get_by_role("button", name="Change password").click()
    expect(page.get_by_role("alert")).to_have_text("The current password is not correct.")
    assert elsewhere.get("/api/session").status_code == 200  # nothing changed

    page.get_by_label("Current password").fill(PASSWORD)
    page.get_by_label("New password", exact=True).fill(NEW_PASSWORD)
    page.get_by_label("New password, again").fill(NEW_PASSWORD)
    page.get_by_role("button", name="Change password").click()
    expect(page.get_by_role("alert")).to_contain_text("Password changed")
    screenshot(page, "account")

    assert elsewhere.get("/api/session").status_code == 401  # ended on the server
    page.reload()  # this session stays
    expect(page).to_have_url(f"{live_gateway.url}/dashboard/account")
    old = httpx.post(
        f"{live_gateway.url}/api/session", json={"username": "erin", "password": PASSWORD}
    )
    assert old.status_code == 401
    _password_sign_in(live_gateway.url, NEW_PASSWORD).close()
    elsewhere.close()
    watch.assert_clean()


@pytest.fixture
def live_oidc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[LiveGateway, FakeProvider]]:
    """The scripted gateway with a provider on a local port behind its sign-in button."""
    monkeypatch.setenv("GATEWAY_OIDC_CLIENT_SECRET", CLIENT_SECRET)
    with running_provider() as provider:
        provider.email = "erin@example.com"
        oidc = {"name": "Example ID", "issuer": provider.issuer, "client_id": CLIENT_ID}
        harness = build_harness(tmp_path / "gw.db", {"dashboard": {"oidc": oidc}})
        start = lambda: start_heads(harness)  # noqa: E731
        with serving(harness.app, harness.store, start, harness.aclose) as live:
            yield live, provider


def test_sign_in_with_the_provider(page: Page, live_oidc: tuple[LiveGateway, FakeProvider]) -> None:
    live, provider = live_oidc
    live.store.set_membership("erin@example.com", "acme", "admin")
    page.goto(f"{live.url}/dashboard/usage")
    expect(page).to_have_url(f"{live.url}/dashboard/login?next=/dashboard/usage")
    screenshot(page, "sign-in-oidc")
    page.get_by_role("link", name="Sign in with Example ID").click()
    expect(page).to_have_url(f"{live.url}/dashboard/usage")
    expect(page.locator("#who-user")).to_have_text("erin@example.com")

    # Someone the gateway does not know is sent back with the page's own sentence.
    page.get_by_role("button", name="Sign out").click()
    provider.email = "mallory@example.com"
    page.get_by_role("link", name="Sign in with Example ID").click()
    expect(page).to_have_url(f"{live.url}/dashboard/login?oidc_error=unknown_user")
    expect(page.get_by_role("alert")).to_contain_text("no account on this gateway")
