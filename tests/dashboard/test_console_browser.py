"""Running an organization from the console in chromium: keys, usage, members, sessions.

Each test signs in through the sign-in page, so the session cookie, the CSRF token and
the pages' scripts are the ones a person's browser gets.
"""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from playwright.sync_api import FilePayload, Page, expect

from tests.dashboard.browser import PageWatch, assert_fits_narrow, screenshot, sign_in
from tests.dashboard.conftest import LiveGateway
from tests.fixtures.adapters import LORA_BASE, adapter_files, zipped
from tests.fixtures.dashboard import PASSWORD
from tests.unit.dedicated.conftest import DedicatedHarness

CHAT = {"model": "scripted-chat", "messages": [{"role": "user", "content": "hello"}]}


def _user(live: LiveGateway, name: str, role: str) -> str:
    return live.user(name, "acme", role)


def _create_key(page: Page, name: str) -> str:
    page.get_by_label("Name").fill(name)
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#key-secret-value")
    expect(secret).not_to_be_empty()
    return secret.inner_text()


def _sdk(live: LiveGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{live.url}/v1", max_retries=0)


def test_a_key_made_in_the_page_works_until_revoked_there(
    page: Page, live_gateway: LiveGateway
) -> None:
    _user(live_gateway, "erin", "admin")
    watch = PageWatch(live_gateway.url)
    watch.attach(page)
    sign_in(page, live_gateway.url, "erin", PASSWORD)
    secret = _create_key(page, "ci key")
    row = page.locator("#keys-table tbody tr", has_text="ci key")
    expect(row).to_contain_text("active")
    assert secret not in page.locator("#keys-table").inner_text()  # listed without it
    answer = _sdk(live_gateway, secret).chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert answer.choices[0].message.content
    screenshot(page, "keys")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Revoke key ci key").click()
    expect(row).to_contain_text("revoked")
    with pytest.raises(openai.AuthenticationError) as refused:
        _sdk(live_gateway, secret).chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert refused.value.status_code == 401
    watch.assert_clean()


def test_the_usage_page_shows_the_ledgers_tokens(page: Page, live_gateway: LiveGateway) -> None:
    user_id = _user(live_gateway, "erin", "admin")
    sign_in(page, live_gateway.url, "erin", PASSWORD)
    secret = _create_key(page, "usage key")
    answer = _sdk(live_gateway, secret).chat.completions.create(**CHAT)  # type: ignore[call-overload]
    records = live_gateway.ledger().store.records_for(user_id)
    ledger_tokens = sum(r.prompt_tokens + r.completion_tokens for r in records)
    assert answer.usage is not None and ledger_tokens == answer.usage.total_tokens

    page.goto(f"{live_gateway.url}/dashboard/usage")
    row = page.locator('#usage-table tbody tr[data-group="scripted-chat"]')
    expect(row).to_be_visible()
    cells = row.locator("td").all_inner_texts()
    prompt, completion, total = (int(c.replace(",", "")) for c in cells[1:4])
    assert (prompt, completion, total) == (
        sum(r.prompt_tokens for r in records),
        sum(r.completion_tokens for r in records),
        ledger_tokens,
    )
    expect(page.locator("#usage-chart svg rect.bar")).to_have_count(30)
    csv = page.get_by_role("link", name="Export CSV").get_attribute("href")
    assert csv is not None and csv.startswith("/api/billing/usage.csv?")
    screenshot(page, "usage")


def _status_of(page: Page, method: str, path: str, body: object, csrf: bool = True) -> int:
    """The status a script of the page gets for a call with the session cookie."""
    script = """async ([method, path, body, csrf]) => {
        const headers = {"Content-Type": "application/json"};
        if (csrf) headers["X-CSRF-Token"] = GW.session.csrf_token;
        const r = await fetch(path, {method, headers, body: JSON.stringify(body)});
        return r.status;
    }"""
    status: int = page.evaluate(script, [method, path, body, csrf])
    return status


def test_a_member_cannot_reach_admin_pages_or_their_api(
    page: Page, live_gateway: LiveGateway
) -> None:
    _user(live_gateway, "mallory", "member")
    sign_in(page, live_gateway.url, "mallory", PASSWORD)
    nav = page.get_by_role("navigation")
    expect(nav.get_by_role("link", name="API keys")).to_be_visible()
    expect(nav.get_by_role("link", name="Members and flags")).to_have_count(0)
    answer = page.goto(f"{live_gateway.url}/dashboard/members")
    assert answer is not None and answer.status == 403
    expect(page.locator("#flags-form")).to_have_count(0)
    flag = {"external_providers_enabled": True}
    assert _status_of(page, "PATCH", "/api/orgs/current", flag) == 403
    member = {"username": "mallory2", "role": "admin", "password": PASSWORD}
    assert _status_of(page, "POST", "/api/orgs/current/members", member) == 403
    org = live_gateway.store.get_org("acme")
    assert org is not None and not org.external_providers_enabled
    assert live_gateway.store.get_user("mallory2") is None
    # The header still works on the refused page.
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(f"{live_gateway.url}/dashboard/login")


def test_a_write_without_the_csrf_token_is_refused(page: Page, live_gateway: LiveGateway) -> None:
    _user(live_gateway, "erin", "admin")
    sign_in(page, live_gateway.url, "erin", PASSWORD)
    # The page's own origin, the cookie sent, the header missing.
    assert _status_of(page, "POST", "/api/keys", {"name": "no token"}, csrf=False) == 403
    # Another site's form (about:blank is no origin of the gateway) posting to the API.
    form = (
        f'<form method="post" action="{live_gateway.url}/api/keys" enctype="text/plain">'
        '<input name=\'{"name": "forged", "x": "\' value=\'"}\'>'
        "<button>go</button></form>"
    )
    page.goto("about:blank")
    page.set_content(form)
    with page.expect_navigation() as posted:
        page.get_by_role("button", name="go").click()
    answer = posted.value
    assert answer is not None and answer.status in (401, 403)
    page.goto(f"{live_gateway.url}/dashboard/keys")
    names = page.locator("#keys-table tbody").inner_text()
    assert "forged" not in names and "no token" not in names


def test_sign_out_ends_the_session(page: Page, live_gateway: LiveGateway) -> None:
    _user(live_gateway, "erin", "admin")
    sign_in(page, live_gateway.url, "erin", PASSWORD)
    cookie = next(c for c in page.context.cookies() if c["name"] == "gw_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(f"{live_gateway.url}/dashboard/login")
    # The old cookie, replayed, is no session any more: it ended on the server.
    old = httpx.get(f"{live_gateway.url}/api/session", cookies={"gw_session": cookie["value"]})
    assert old.status_code == 401
    page.goto(f"{live_gateway.url}/dashboard/keys")
    expect(page).to_have_url(f"{live_gateway.url}/dashboard/login?next=/dashboard/keys")


def test_the_playground_streams_an_answer(page: Page, live_gateway: LiveGateway) -> None:
    _user(live_gateway, "erin", "admin")
    sign_in(page, live_gateway.url, "erin", PASSWORD)
    streamed: list[bool] = []
    page.on(
        "response",
        lambda r: (
            streamed.append("text/event-stream" in r.headers.get("content-type", ""))
            if r.url.endswith("/v1/chat/completions")
            else None
        ),
    )
    page.goto(f"{live_gateway.url}/dashboard/playground")
    page.get_by_label("Model").select_option("scripted-chat")
    page.get_by_label("Message").fill("Say something")
    page.get_by_label("Message").press("Control+Enter")
    answer = page.locator(".msg.assistant .text")
    expect(answer).not_to_be_empty()
    expect(page.locator("#play-usage")).to_contain_text("completion tokens")
    assert streamed == [True]
    screenshot(page, "playground")


@pytest.mark.parametrize(
    "slug", ["keys", "usage", "members", "batches", "adapters", "playground", "account"]
)
def test_every_page_loads_its_data_cleanly(
    page: Page, live_gateway: LiveGateway, slug: str
) -> None:
    """No script error, no API error shown, nothing fetched from outside the gateway."""
    _user(live_gateway, "erin", "admin")
    watch = PageWatch(live_gateway.url)
    watch.attach(page)
    sign_in(page, live_gateway.url, "erin", PASSWORD)
    page.goto(f"{live_gateway.url}/dashboard/{slug}")
    page.wait_for_load_state("networkidle")
    expect(page.get_by_role("alert")).to_be_hidden()
    page.keyboard.press("Tab")  # the first stop is the skip link, for keyboard users
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    assert_fits_narrow(page)
    watch.assert_clean()


def test_a_dedicated_endpoint_from_create_to_delete(
    page: Page, live_dedicated: tuple[LiveGateway, DedicatedHarness]
) -> None:
    live, harness = live_dedicated
    live.user("erin", "acme", "admin")
    watch = PageWatch(live.url)
    watch.attach(page)
    sign_in(page, live.url, "erin", PASSWORD)
    page.goto(f"{live.url}/dashboard/dedicated")
    expect(page.locator("#rates-table")).to_contain_text("l4")
    page.get_by_label("Model").select_option("ded-chat")
    page.get_by_label("Alias").fill("my-endpoint")
    page.get_by_label("Max replicas", exact=True).fill("2")
    page.get_by_role("button", name="Create endpoint").click()
    card = page.locator("article", has_text="ded/my-endpoint")
    expect(card).to_contain_text("provisioning")
    harness.converge(boot=True)
    page.reload()
    expect(card).to_contain_text("0–2")

    card.locator("summary", has_text="Scale").click()
    card.get_by_label("Max replicas").fill("3")
    card.get_by_role("button", name="Scale").click()
    expect(card).to_contain_text("0–3")
    card.locator("summary", has_text="Change mode").click()
    card.get_by_label("New mode").select_option("reserved")
    card.get_by_role("button", name="Preview change").click()
    preview = card.locator(".preview")
    expect(preview).to_contain_text("spot → reserved")
    # Still provisioning: the preview says why it cannot be done now, and offers no confirm.
    expect(preview).to_contain_text("Not possible now: endpoint_busy")
    expect(card.get_by_role("button", name="Confirm redeploy")).to_be_hidden()
    screenshot(page, "dedicated")
    assert_fits_narrow(page)

    page.once("dialog", lambda dialog: dialog.accept())
    card.get_by_role("button", name="Delete ded/my-endpoint").click()
    expect(card).to_have_count(0)
    org = live.store.get_org("acme")
    assert org is not None and harness.dedicated.store.list_org(org.id) == []
    watch.assert_clean()


def test_an_admin_sets_flags_and_adds_a_member(page: Page, live_gateway: LiveGateway) -> None:
    live_gateway.user("erin", "acme", "admin")
    sign_in(page, live_gateway.url, "erin", PASSWORD)
    page.goto(f"{live_gateway.url}/dashboard/members")
    page.get_by_label("External providers").check()
    page.get_by_role("button", name="Save flags").click()
    expect(page.get_by_role("alert")).to_have_text("Flags saved.")
    org = live_gateway.store.get_org("acme")
    assert org is not None and org.external_providers_enabled

    page.get_by_label("Username").fill("frank")
    page.get_by_label("Password (a new user only)").fill(PASSWORD)
    page.get_by_role("button", name="Add member").click()
    row = page.locator("#members-table tbody tr", has_text="frank")
    expect(row.get_by_label("Role of frank", exact=True)).to_have_value("member")
    screenshot(page, "members")
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(f"{live_gateway.url}/dashboard/login")
    sign_in(page, live_gateway.url, "frank", PASSWORD)  # the new member signs in


def test_a_batch_from_an_uploaded_file_and_its_cancel(
    page: Page, live_gateway: LiveGateway
) -> None:
    live_gateway.user("erin", "acme", "admin")
    sign_in(page, live_gateway.url, "erin", PASSWORD)
    page.goto(f"{live_gateway.url}/dashboard/batches")
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": CHAT}
    page.get_by_label("JSONL file of batch lines").set_input_files(
        files=[
            FilePayload(
                name="lines.jsonl",
                mimeType="application/jsonl",
                buffer=(json.dumps(line) + "\n").encode(),
            )
        ]
    )
    page.get_by_role("button", name="Upload").click()
    expect(page.locator("#files-table tbody")).to_contain_text("lines.jsonl")
    uploaded = page.locator("#files-table tbody tr", has_text="lines.jsonl")
    page.get_by_label("Input file").select_option(uploaded.get_attribute("data-file-id"))
    page.get_by_role("button", name="Create batch").click()
    row = page.locator("#batches-table tbody tr").first
    expect(row).to_contain_text("/v1/chat/completions")
    batch_id = row.get_attribute("data-batch-id")
    screenshot(page, "batches")
    # No batch worker runs in this gateway: the batch waits, and is cancelled.
    page.get_by_role("button", name=f"Cancel batch {batch_id}").click()
    expect(row).to_contain_text(re.compile("cancell(ing|ed)"))


def _upload_adapter(page: Page, name: str) -> None:
    archive = FilePayload(name="a.zip", mimeType="application/zip", buffer=zipped(adapter_files()))
    page.get_by_label("Archive").set_input_files(files=[archive])
    page.get_by_label("Name").fill(name)
    page.get_by_label("Base model").select_option(LORA_BASE)
    page.get_by_role("button", name="Upload").click()


def test_adapters_upload_list_delete_and_a_members_refusal(
    page: Page, live_lora: LiveGateway
) -> None:
    live_lora.user("erin", "acme", "admin")
    live_lora.user("mallory", "acme", "member")
    sign_in(page, live_lora.url, "mallory", PASSWORD)
    page.goto(f"{live_lora.url}/dashboard/adapters")
    _upload_adapter(page, "mine")
    # The API's own words, not a status code or a trace.
    expect(page.get_by_role("alert")).to_contain_text("admin")
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(f"{live_lora.url}/dashboard/login")

    sign_in(page, live_lora.url, "erin", PASSWORD)
    page.goto(f"{live_lora.url}/dashboard/adapters")
    _upload_adapter(page, "mine")
    row = page.locator('#adapters-table tbody tr[data-adapter="mine"]')
    expect(row).to_contain_text(f"{LORA_BASE}:mine")
    expect(row).to_contain_text("organization")
    screenshot(page, "adapters")
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Delete adapter mine").click()
    expect(row).to_have_count(0)


def test_only_platform_admins_get_the_ray_dashboard_link(
    page: Page, live_gateway: LiveGateway
) -> None:
    live_gateway.user("erin", "acme", "admin")
    live_gateway.user("ivan", "initech", "admin")
    live_gateway.store.update_org("initech", internal=True)
    sign_in(page, live_gateway.url, "erin", PASSWORD)
    page.wait_for_load_state("networkidle")
    expect(page.get_by_role("link", name="Ray dashboard")).to_be_hidden()
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(f"{live_gateway.url}/dashboard/login")

    sign_in(page, live_gateway.url, "ivan", PASSWORD)
    link = page.get_by_role("link", name="Ray dashboard")
    expect(link).to_be_visible()
    assert (link.get_attribute("href") or "").startswith("http")
    assert link.get_attribute("title")  # where the token is
    # ... and, not only as a tooltip, in words on their account page.
    page.goto(f"{live_gateway.url}/dashboard/account")
    expect(page.locator("#ray-token")).to_contain_text("get-auth-token")


def test_the_organization_switcher_changes_what_the_pages_show(
    page: Page, live_gateway: LiveGateway
) -> None:
    live_gateway.user("erin", "acme", "admin")
    live_gateway.store.set_membership("erin", "globex", "member")
    sign_in(page, live_gateway.url, "erin", PASSWORD)
    nav = page.get_by_role("navigation")
    expect(nav.get_by_role("link", name="Members and flags")).to_be_visible()
    switcher = page.get_by_label("Organization")
    expect(switcher).to_be_enabled()
    globex = page.locator("#org-select option", has_text="globex").get_attribute("value")
    assert globex is not None
    switcher.select_option(globex)
    # The page reloads in the other organization, where erin is a member.
    expect(nav.get_by_role("link", name="Members and flags")).to_have_count(0)
    expect(switcher).to_have_value(globex)


def test_sign_in_never_sends_to_another_site(page: Page, live_gateway: LiveGateway) -> None:
    live_gateway.user("erin", "acme", "admin")
    page.goto(f"{live_gateway.url}/dashboard/login?next=https://evil.example/")
    page.get_by_label("Username").fill("erin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{live_gateway.url}/dashboard/keys")
