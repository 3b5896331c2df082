"""Dashboard sessions over HTTP: sign-in, cookie, CSRF, sign-out, expiry, rate limit,
password change, one-time links, and a session on the API-key routes
(docs/reference/dashboard.md#session)."""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import urlparse

import httpx
import pytest
import sqlalchemy as sa

from serve_app.auth.sessions import SessionStore
from serve_app.storage.schema import memberships, usage_records, utcnow
from tests.fixtures.dashboard import PASSWORD, browser, session_store, sign_in, signed_in
from tests.fixtures.gateway import GatewayHarness

CHAT = {"model": "scripted-chat", "messages": [{"role": "user", "content": "hi"}]}


def _cookie_header(resp: httpx.Response) -> str:
    cookies = [v for k, v in resp.headers.multi_items() if k.lower() == "set-cookie"]
    assert len(cookies) == 1
    return cookies[0]


async def test_sign_in_sets_a_session_cookie_and_answers_the_session(
    gateway: GatewayHarness,
) -> None:
    session_store(gateway).set_password("alice", PASSWORD)
    async with browser(gateway) as http:
        resp = await http.post("/api/session", json={"username": "alice", "password": PASSWORD})
        assert resp.status_code == 200
        body = resp.json()
        assert body["user"]["name"] == "alice"
        assert body["org"]["name"] == "acme" and body["org"]["role"] == "member"
        assert [o["name"] for o in body["orgs"]] == ["acme"]
        assert len(body["csrf_token"]) >= 32 and body["expires_at"] > utcnow().timestamp()
        cookie = _cookie_header(resp).lower()
        assert cookie.startswith("gw_session=")
        for attribute in ("httponly", "samesite=lax", "path=/"):
            assert attribute in cookie
        assert "secure" not in cookie  # localhost: browsers keep it over plain HTTP
        again = await http.get("/api/session")
    assert again.status_code == 200 and again.json() == body


async def test_cookie_is_secure_outside_localhost(gateway: GatewayHarness) -> None:
    session_store(gateway).set_password("alice", PASSWORD)
    async with browser(gateway, "http://gateway.test") as http:
        resp = await http.post("/api/session", json={"username": "alice", "password": PASSWORD})
    assert "; secure" in _cookie_header(resp).lower()


@pytest.mark.parametrize(("username", "password"), [("alice", "wrong pass"), ("nobody", PASSWORD)])
async def test_wrong_credentials_are_401(
    gateway: GatewayHarness, username: str, password: str
) -> None:
    session_store(gateway).set_password("alice", PASSWORD)
    async with browser(gateway) as http:
        resp = await http.post("/api/session", json={"username": username, "password": password})
        after = await http.get("/api/session")
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "invalid_credentials"
    assert "set-cookie" not in resp.headers
    assert after.status_code == 401


async def test_a_user_without_a_password_cannot_sign_in(gateway: GatewayHarness) -> None:
    async with browser(gateway) as http:
        resp = await http.post("/api/session", json={"username": "alice", "password": ""})
        empty = await http.post("/api/session", json={"username": "alice", "password": "x" * 8})
    assert resp.status_code == 400  # min_length
    assert empty.status_code == 401


async def test_sign_in_needs_a_json_body(gateway: GatewayHarness) -> None:
    """A cross-site form can post text/plain or a urlencoded form, never JSON."""
    session_store(gateway).set_password("alice", PASSWORD)
    body = json.dumps({"username": "alice", "password": PASSWORD})
    async with browser(gateway) as http:
        plain = await http.post(
            "/api/session", content=body, headers={"content-type": "text/plain"}
        )
        form = await http.post("/api/session", data={"username": "alice", "password": PASSWORD})
    assert plain.status_code in (400, 415) and "set-cookie" not in plain.headers
    assert form.status_code in (400, 415) and "set-cookie" not in form.headers


async def test_session_routes_refuse_keys_and_anonymous_callers(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        with_key = await http.get("/api/session")
    async with gateway.client("gwk_" + "A" * 40) as http:
        bad_key = await http.get("/api/session")
    async with browser(gateway) as http:
        anonymous = await http.get("/api/session")
        forged = await http.get("/api/session", cookies={"gw_session": "forged"})
    assert with_key.status_code == 403
    assert with_key.json()["error"]["code"] == "session_required"
    assert bad_key.status_code == 401
    assert anonymous.status_code == 401 and forged.status_code == 401
    assert anonymous.json()["error"]["code"] == "invalid_session"


async def test_writes_need_the_csrf_token(gateway: GatewayHarness) -> None:
    async with signed_in(gateway, "alice") as http:
        org_id = (await http.get("/api/session")).json()["org"]["id"]
        token = http.headers.pop("X-CSRF-Token")
        missing = await http.post("/api/session/org", json={"org_id": org_id})
        wrong = await http.post(
            "/api/session/org", json={"org_id": org_id}, headers={"X-CSRF-Token": "nope"}
        )
        sign_out = await http.delete("/api/session")
        right = await http.post(
            "/api/session/org", json={"org_id": org_id}, headers={"X-CSRF-Token": token}
        )
    for resp in (missing, wrong, sign_out):
        assert resp.status_code == 403
        assert resp.json()["error"]["code"] == "csrf_failed"
    assert right.status_code == 200


async def test_sign_out_ends_the_session_server_side(gateway: GatewayHarness) -> None:
    async with signed_in(gateway, "alice") as http:
        stolen = dict(http.cookies)
        resp = await http.delete("/api/session")
        assert resp.status_code == 204
        assert "gw_session=" in _cookie_header(resp)  # cleared in the browser
        after = await http.get("/api/session")
    async with browser(gateway) as other:
        replayed = await other.get("/api/session", cookies=stolen)
    assert after.status_code == 401 and replayed.status_code == 401


def test_sessions_expire(gateway: GatewayHarness) -> None:
    real = session_store(gateway)
    now = [utcnow()]
    store = SessionStore(real._db, real._accounts, ttl_s=600, clock=lambda: now[0])
    user_id = store.set_password("alice", PASSWORD)
    token, session = store.start(user_id)
    assert store.lookup(token) == session
    now[0] += timedelta(seconds=599)
    assert store.lookup(token) is not None
    now[0] += timedelta(seconds=2)
    assert store.lookup(token) is None


async def test_sign_in_attempts_are_rate_limited(gateway: GatewayHarness) -> None:
    session_store(gateway).set_password("alice", PASSWORD)
    async with browser(gateway) as http:
        statuses = [
            (
                await http.post("/api/session", json={"username": "alice", "password": "bad"})
            ).status_code
            for _ in range(10)
        ]
        limited = await http.post("/api/session", json={"username": "alice", "password": PASSWORD})
        other_user = await http.post(
            "/api/session", json={"username": "carol", "password": PASSWORD}
        )
    assert statuses == [401] * 10
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(limited.headers["retry-after"]) >= 1
    assert other_user.status_code == 401  # counted per user name (and per client)


async def test_a_password_change_ends_the_other_sessions(gateway: GatewayHarness) -> None:
    async with signed_in(gateway, "alice") as first, browser(gateway) as second:
        await sign_in(second, "alice")
        wrong = await first.post(
            "/api/session/password",
            json={"current_password": "not it", "new_password": "another password"},
        )
        changed = await first.post(
            "/api/session/password",
            json={"current_password": PASSWORD, "new_password": "another password"},
        )
        kept = await first.get("/api/session")
        ended = await second.get("/api/session")
        old = await second.post("/api/session", json={"username": "alice", "password": PASSWORD})
        new = await second.post(
            "/api/session", json={"username": "alice", "password": "another password"}
        )
    assert wrong.status_code == 403
    assert changed.status_code == 204
    assert kept.status_code == 200 and ended.status_code == 401
    assert old.status_code == 401 and new.status_code == 200


async def test_setting_a_password_ends_every_session(gateway: GatewayHarness) -> None:
    async with signed_in(gateway, "alice") as http:
        session_store(gateway).set_password("alice", "reset by operator")
        assert (await http.get("/api/session")).status_code == 401


async def test_a_one_time_link_signs_in_once(gateway: GatewayHarness) -> None:
    token = session_store(gateway).create_login_token("alice")
    path = f"/dashboard/login/token?token={token}"
    async with browser(gateway) as http:
        first = await http.get(path)
        session = await http.get("/api/session")
    async with browser(gateway) as http:
        second = await http.get(path)
        unknown = await http.get("/dashboard/login/token?token=nope")
    assert first.status_code == 303 and urlparse(first.headers["location"]).path == "/dashboard"
    assert session.status_code == 200 and session.json()["user"]["name"] == "alice"
    assert second.status_code == 401 and unknown.status_code == 401


def test_a_link_expires(gateway: GatewayHarness) -> None:
    real = session_store(gateway)
    now = [utcnow()]
    store = SessionStore(real._db, real._accounts, ttl_s=600, link_ttl_s=60, clock=lambda: now[0])
    token = store.create_login_token("alice")
    now[0] += timedelta(seconds=61)
    assert store.redeem_login_token(token) is None


async def test_switching_organization(gateway: GatewayHarness) -> None:
    gateway.store.set_membership("alice", "second-org", "admin")
    gateway.store.ensure_org("foreign")
    async with signed_in(gateway, "alice") as http:
        body = (await http.get("/api/session")).json()
        target = next(o for o in body["orgs"] if o["name"] == "second-org")
        switched = await http.post("/api/session/org", json={"org_id": target["id"]})
        foreign_id = gateway.store.get_org("foreign")
        assert foreign_id is not None
        foreign = await http.post("/api/session/org", json={"org_id": foreign_id.id})
        now = await http.get("/api/session")
    assert switched.status_code == 200
    assert switched.json()["org"] == {"id": target["id"], "name": "second-org", "role": "admin"}
    assert foreign.status_code == 404
    assert now.json()["org"]["name"] == "second-org"


async def test_a_session_is_accepted_on_the_api_key_routes(gateway: GatewayHarness) -> None:
    async with signed_in(gateway, "alice") as http:
        models = await http.get("/v1/models")
        token = http.headers.pop("X-CSRF-Token")
        no_csrf = await http.post("/v1/chat/completions", json=CHAT)
        chat = await http.post("/v1/chat/completions", json=CHAT, headers={"X-CSRF-Token": token})
        session_id = (await http.get("/api/session")).json()
    assert models.status_code == 200
    assert no_csrf.status_code == 403 and no_csrf.json()["error"]["code"] == "csrf_failed"
    assert chat.status_code == 200, chat.text
    await gateway.metering.aclose()  # commit the spooled usage
    with gateway.store.database.connect() as conn:
        keys = list(conn.execute(sa.select(usage_records.c.key_id)).scalars())
    assert len(keys) == 1 and keys[0].startswith("sess_")
    assert session_id["user"]["name"] == "alice"


async def test_an_api_key_wins_over_a_cookie(gateway: GatewayHarness) -> None:
    """A bad key next to a good cookie is still a 401: the header decides."""
    async with signed_in(gateway, "alice") as http:
        resp = await http.get("/v1/models", headers={"Authorization": "Bearer gwk_" + "B" * 40})
    assert resp.status_code == 401


def test_a_batch_made_in_a_session_runs_while_its_user_is_a_member(
    gateway: GatewayHarness,
) -> None:
    """The batch worker looks its creator up by key id: a session's id works like a key's."""
    store = session_store(gateway)
    user_id = store.set_password("alice", PASSWORD)
    _, session = store.start(user_id)
    store.end(session.id)  # signed out: the batch it made keeps running
    principal = store.principal_for_key_id(session.id)
    assert principal is not None and principal.user_id == user_id
    assert principal.scopes == frozenset({"inference", "dedicated"})
    key = gateway.store.find_key(gateway.store.hash(gateway.keys["user"]))
    assert key is not None and store.principal_for_key_id(key.key_id) == key.principal
    revoked = gateway.store.find_key(gateway.store.hash(gateway.keys["revoked"]))
    assert revoked is not None and store.principal_for_key_id(revoked.key_id) is None
    with gateway.store.write() as conn:
        conn.execute(sa.delete(memberships).where(memberships.c.user_id == user_id))
    assert store.principal_for_key_id(session.id) is None


async def test_idempotent_answers_are_kept_per_session(gateway: GatewayHarness) -> None:
    """Two sessions (or a session and nobody) sending one Idempotency-Key never share an
    answer: the slot is the caller's credential, here the session's cookie."""
    headers = {"Idempotency-Key": "same-key-123"}
    async with signed_in(gateway, "alice") as alice, signed_in(gateway, "carol") as carol:
        first = await alice.post("/v1/chat/completions", json=CHAT, headers=headers)
        replay = await alice.post("/v1/chat/completions", json=CHAT, headers=headers)
        other = await carol.post("/v1/chat/completions", json=CHAT, headers=headers)
    async with browser(gateway) as anonymous:
        nobody = await anonymous.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert first.status_code == replay.status_code == other.status_code == 200
    assert replay.headers.get("idempotent-replayed") == "true"
    assert other.headers.get("idempotent-replayed") != "true"
    assert other.json()["id"] != first.json()["id"]
    assert nobody.status_code == 401
