"""OpenID Connect sign-in end to end: the gateway (in process) against a provider on a
local port (tests/fixtures/oidc_provider.py), with a cookie-keeping client as the
browser. Each refusal is made by the provider signing what it was told to, so what
refuses it is the gateway's own check (state, nonce, audience, expiry, issuer,
signature, email rules, unknown user), and no refusal leaves a session behind."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from joserfc.jwk import RSAKey

from serve_app.auth.dashboard import SESSION_COOKIE
from serve_app.auth.oidc import FLOW_TTL_S, OidcClient, OidcError
from serve_app.auth.oidc_config import OidcOptions
from serve_app.cli.check.oidc import check_oidc
from serve_app.config import GatewayAppArgs
from tests.fixtures.dashboard import browser
from tests.fixtures.gateway import GatewayHarness, build_harness
from tests.fixtures.oidc_provider import (
    CLIENT_ID,
    CLIENT_SECRET,
    FakeProvider,
    running_provider,
)

ALICE = "alice@example.com"


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with running_provider() as found:
        yield found


def oidc_args(provider: FakeProvider, **extra: Any) -> dict[str, Any]:
    oidc = {"name": "Example ID", "issuer": provider.issuer, "client_id": CLIENT_ID, **extra}
    return {"dashboard": {"oidc": oidc}}


async def build(tmp_path: Path, provider: FakeProvider, **extra: Any) -> GatewayHarness:
    harness = build_harness(tmp_path / "gw.db", oidc_args(provider, **extra))
    harness.store.set_membership(ALICE, "acme", "admin")
    return harness


@pytest.fixture
async def gateway(
    tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[GatewayHarness]:
    monkeypatch.setenv("GATEWAY_OIDC_CLIENT_SECRET", CLIENT_SECRET)
    provider.email, provider.claims, provider.sign_with = ALICE, {}, None
    harness = await build(tmp_path, provider)
    yield harness
    await harness.aclose()


async def through_provider(
    http: httpx.AsyncClient, provider: FakeProvider, next_page: str | None = None
) -> str:
    """Start a sign-in and let the provider sign the user in: the callback URL it sends
    the browser to."""
    start = await http.get(
        "/api/session/oidc/start", params={"next": next_page} if next_page else None
    )
    assert start.status_code == 303, start.text
    authorize = start.headers["location"]
    assert authorize.startswith(f"{provider.issuer}/authorize?")
    async with httpx.AsyncClient() as outside:
        at_provider = await outside.get(authorize)
    assert at_provider.status_code == 302, at_provider.text
    return at_provider.headers["location"]


async def refused_with(http: httpx.AsyncClient, callback: str, code: str) -> None:
    answer = await http.get(callback)
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/dashboard/login?oidc_error={code}"
    assert SESSION_COOKIE not in http.cookies
    assert (await http.get("/api/session")).status_code == 401


async def test_a_provider_sign_in_starts_the_same_session_as_a_password(
    gateway: GatewayHarness, provider: FakeProvider
) -> None:
    async with browser(gateway) as http:
        callback = await through_provider(http, provider, "/dashboard/usage")
        query = parse_qs(urlsplit(callback).query)
        assert callback.startswith("http://localhost/api/session/oidc/callback?")
        assert set(query) == {"code", "state"}
        answer = await http.get(callback)
        assert answer.status_code == 303
        assert answer.headers["location"] == "/dashboard/usage"
        assert "gw_oidc" not in http.cookies  # the flow's cookie is spent
        session = (await http.get("/api/session")).json()
        assert session["user"]["name"] == ALICE
        assert session["org"] == {"id": session["org"]["id"], "name": "acme", "role": "admin"}
        # The same session as a password's: its CSRF token guards writes.
        http.headers["X-CSRF-Token"] = session["csrf_token"]
        assert (await http.post("/api/keys", json={"name": "from-oidc"})).status_code == 201


async def test_the_authorization_request_carries_state_nonce_and_pkce(
    gateway: GatewayHarness, provider: FakeProvider
) -> None:
    async with browser(gateway) as http:
        start = await http.get("/api/session/oidc/start", params={"next": "https://evil.test/"})
        query = parse_qs(urlsplit(start.headers["location"]).query)
        cookie = start.headers["set-cookie"]
    assert query["client_id"] == [CLIENT_ID]
    assert query["response_type"] == ["code"]
    assert query["code_challenge_method"] == ["S256"]
    assert query["scope"] == ["openid email profile"]
    assert len(query["state"][0]) >= 32 and len(query["nonce"][0]) >= 32
    assert query["redirect_uri"] == ["http://localhost/api/session/oidc/callback"]
    assert "HttpOnly" in cookie and "Path=/api/session/oidc" in cookie
    assert "samesite=lax" in cookie.lower()
    assert query["state"][0] not in cookie  # signed, but the flow's secrets are not the state


async def test_a_callback_with_another_state_is_refused_before_any_code_exchange(
    gateway: GatewayHarness, provider: FakeProvider
) -> None:
    async with browser(gateway) as http:
        callback = await through_provider(http, provider)
        calls = provider.token_calls
        code = parse_qs(urlsplit(callback).query)["code"][0]
        forged = f"/api/session/oidc/callback?code={code}&state=not-the-state"
        await refused_with(http, forged, "invalid_state")
    assert provider.token_calls == calls


async def test_a_callback_in_a_browser_that_started_nothing_is_refused(
    gateway: GatewayHarness, provider: FakeProvider
) -> None:
    """Login CSRF: an attacker's own code, sent to a victim's browser, signs nobody in."""
    async with browser(gateway) as attacker:
        callback = await through_provider(attacker, provider)
    async with browser(gateway) as victim:
        await refused_with(victim, callback, "invalid_state")


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        ({"nonce": "another-nonce"}, "wrong nonce"),
        ({"nonce": None}, "no nonce"),
        ({"aud": "another-client"}, "wrong audience"),
        ({"aud": ["another-client"], "azp": CLIENT_ID}, "audience without this client"),
        ({"iss": "https://impostor.example"}, "wrong issuer"),
        ({"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}, "expired"),
    ],
)
async def test_an_id_token_failing_a_claim_is_refused(
    gateway: GatewayHarness, provider: FakeProvider, claims: dict[str, Any], why: str
) -> None:
    provider.claims = claims
    async with browser(gateway) as http:
        await refused_with(http, await through_provider(http, provider), "invalid_id_token")


async def test_an_id_token_signed_by_another_key_is_refused(
    gateway: GatewayHarness, provider: FakeProvider
) -> None:
    provider.sign_with = RSAKey.generate_key(2048, {"kid": "k1"})
    async with browser(gateway) as http:
        await refused_with(http, await through_provider(http, provider), "invalid_id_token")


async def test_an_unknown_user_is_refused_and_not_created(
    gateway: GatewayHarness, provider: FakeProvider
) -> None:
    provider.email = "mallory@example.com"
    async with browser(gateway) as http:
        await refused_with(http, await through_provider(http, provider), "unknown_user")
    assert gateway.store.get_user("mallory@example.com") is None


async def test_an_unverified_email_is_refused(
    gateway: GatewayHarness, provider: FakeProvider
) -> None:
    provider.claims = {"email_verified": False}
    async with browser(gateway) as http:
        await refused_with(http, await through_provider(http, provider), "email_not_allowed")


async def test_the_email_is_matched_without_regard_to_case(
    gateway: GatewayHarness, provider: FakeProvider
) -> None:
    provider.email = "Alice@Example.COM"
    async with browser(gateway) as http:
        answer = await http.get(await through_provider(http, provider))
        assert answer.headers["location"] == "/dashboard"
        assert (await http.get("/api/session")).json()["user"]["name"] == ALICE


async def test_only_the_allowed_email_domains_sign_in(
    tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_OIDC_CLIENT_SECRET", CLIENT_SECRET)
    provider.email, provider.claims, provider.sign_with = ALICE, {}, None
    harness = await build(tmp_path, provider, allowed_email_domains=["example.org"])
    async with browser(harness) as http:
        await refused_with(http, await through_provider(http, provider), "email_not_allowed")
    await harness.aclose()


async def test_first_time_users_join_one_organization_as_members_when_configured(
    tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_OIDC_CLIENT_SECRET", CLIENT_SECRET)
    provider.email, provider.claims, provider.sign_with = "bob@example.com", {}, None
    harness = await build(tmp_path, provider, create_users={"org": "acme"})
    async with browser(harness) as http:
        answer = await http.get(await through_provider(http, provider))
        assert answer.status_code == 303 and answer.headers["location"] == "/dashboard"
        session = (await http.get("/api/session")).json()
    assert session["user"]["name"] == "bob@example.com"
    assert (session["org"]["name"], session["org"]["role"]) == ("acme", "member")
    await harness.aclose()


async def test_first_time_users_are_refused_when_the_organization_does_not_exist(
    tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_OIDC_CLIENT_SECRET", CLIENT_SECRET)
    provider.email, provider.claims, provider.sign_with = "bob@example.com", {}, None
    harness = await build(tmp_path, provider, create_users={"org": "no-such-org"})
    async with browser(harness) as http:
        await refused_with(http, await through_provider(http, provider), "unknown_user")
    assert harness.store.get_org("no-such-org") is None
    await harness.aclose()


async def test_callbacks_are_rate_limited_per_client(gateway: GatewayHarness) -> None:
    async with browser(gateway) as http:
        for _ in range(30):  # LoginPolicy.per_client
            answer = await http.get("/api/session/oidc/callback?code=x&state=y")
            assert answer.headers["location"].endswith("oidc_error=invalid_state")
        await refused_with(http, "/api/session/oidc/callback?code=x&state=y", "rate_limit_exceeded")


async def test_the_sign_in_page_offers_the_provider(gateway: GatewayHarness) -> None:
    async with browser(gateway) as http:
        page = await http.get("/dashboard/login", params={"next": "/dashboard/usage"})
    assert "Sign in with Example ID" in page.text
    assert 'href="/api/session/oidc/start?next=%2Fdashboard%2Fusage"' in page.text


async def test_without_a_provider_there_is_no_button_and_no_flow(
    sync_gateway: GatewayHarness,
) -> None:
    async with browser(sync_gateway) as http:
        page = await http.get("/dashboard/login")
        start = await http.get("/api/session/oidc/start")
    assert "Sign in with" not in page.text
    assert start.status_code == 404
    assert start.json()["error"]["code"] == "oidc_not_configured"


def test_a_provider_without_its_secret_stops_the_start(
    tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_OIDC_CLIENT_SECRET", raising=False)
    with pytest.raises(ValueError, match="GATEWAY_OIDC_CLIENT_SECRET is unset"):
        build_harness(tmp_path / "gw.db", oidc_args(provider))


def test_production_refuses_a_plain_http_issuer(provider: FakeProvider) -> None:
    with pytest.raises(ValueError, match="issuer must be https in production"):
        GatewayAppArgs.model_validate({"deployment_mode": "production", **oidc_args(provider)})


def test_gateway_check_names_a_missing_secret_and_a_wrong_issuer(
    provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    def problems(**fields: Any) -> list[str]:
        options = OidcOptions.model_validate(
            {"name": "X", "issuer": provider.issuer, "client_id": CLIENT_ID, **fields}
        )
        return [p.line() for p in check_oidc(options)]

    monkeypatch.setenv("GATEWAY_OIDC_CLIENT_SECRET", CLIENT_SECRET)
    assert problems() == []
    monkeypatch.delenv("GATEWAY_OIDC_CLIENT_SECRET")
    (missing,) = problems()
    assert missing.startswith("dashboard.oidc: GATEWAY_OIDC_CLIENT_SECRET (the client secret)")
    monkeypatch.setenv("GATEWAY_OIDC_CLIENT_SECRET", CLIENT_SECRET)
    discovery = f"{provider.issuer}/.well-known/openid-configuration"
    (other,) = problems(issuer=f"{provider.issuer}/realm", discovery_url=discovery)
    assert f"names issuer '{provider.issuer}'" in other
    (down,) = problems(issuer="http://127.0.0.1:9/")
    assert "discovery at http://127.0.0.1:9/.well-known/openid-configuration failed" in down


async def test_the_flow_cookie_expires_and_cannot_be_forged(provider: FakeProvider) -> None:
    now = [time.time()]
    options = OidcOptions(name="X", issuer=provider.issuer, client_id=CLIENT_ID)
    client = OidcClient(options, CLIENT_SECRET, clock=lambda: now[0])
    _, sealed = await client.begin("http://localhost/api/session/oidc/callback", "/dashboard/keys")
    assert client.unseal(sealed).next_path == "/dashboard/keys"
    with pytest.raises(OidcError, match="invalid_state"):
        OidcClient(options, "another secret").unseal(sealed)  # signed with another key
    now[0] += FLOW_TTL_S + 1
    with pytest.raises(OidcError, match="invalid_state"):
        client.unseal(sealed)
