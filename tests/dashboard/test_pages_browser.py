"""The console's pages in chromium: offline, keyboard usable, errors as the API says them."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.dashboard.browser import PageWatch, screenshot
from tests.dashboard.conftest import LiveGateway


def test_sign_in_page_works_offline_and_by_keyboard(page: Page, live_gateway: LiveGateway) -> None:
    watch = PageWatch(live_gateway.url)
    watch.attach(page)
    page.goto(f"{live_gateway.url}/dashboard/keys")
    expect(page).to_have_url(f"{live_gateway.url}/dashboard/login?next=/dashboard/keys")
    expect(page.get_by_label("Username")).to_be_focused()
    page.keyboard.type("nobody")
    page.keyboard.press("Tab")
    page.keyboard.type("wrong password")
    page.keyboard.press("Enter")
    alert = page.get_by_role("alert")
    expect(alert).to_be_visible()
    expect(alert).not_to_contain_text("Traceback")
    screenshot(page, "sign-in")
    watch.assert_clean()
