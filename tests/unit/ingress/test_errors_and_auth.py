"""Envelope on every error, framework ones included (docs/reference/common.md)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from serve_app.auth.accounts import AccountStore
from serve_app.ingress.app import create_app
from tests.fixtures.gateway import GatewayHarness

CHAT = {"model": "scripted-chat", "messages": [{"role": "user", "content": "hi"}]}


def _assert_envelope(body: dict[str, object], code: str | None) -> None:
    assert set(body) == {"error"}
    error = body["error"]
    assert isinstance(error, dict)
    assert set(error) == {"message", "type", "code", "param"}
    assert error["code"] == code


@pytest.mark.parametrize(
    ("header", "message_part"),
    [
        (None, "Missing"),
        ("Basic abc", "Bearer"),
        ("Bearer not-a-key", "malformed"),
        ("Bearer gwk_" + "A" * 40, "incorrect"),
    ],
)
async def test_401_cases(gateway: GatewayHarness, header: str | None, message_part: str) -> None:
    async with gateway.client() as http:
        headers = {"Authorization": header} if header else {}
        resp = await http.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert resp.status_code == 401
    _assert_envelope(resp.json(), "invalid_api_key")
    assert resp.json()["error"]["type"] == "authentication_error"
    assert message_part.lower() in resp.json()["error"]["message"].lower()


async def test_revoked_key_is_401(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["revoked"]) as http:
        resp = await http.get("/v1/models")
    assert resp.status_code == 401
    _assert_envelope(resp.json(), "invalid_api_key")


async def test_scope_and_session_only(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["no_scope"]) as http:
        scope = await http.get("/v1/models")
    async with gateway.client(gateway.keys["user"]) as http:
        session = await http.post("/api/keys", json={})
        nested = await http.get("/api/billing/invoices")
        spelled = [
            await http.request(method, path)
            for method, path in (
                ("GET", "/api/api-keys"),
                ("DELETE", "/api/credentials/key_1"),
                ("PATCH", "/api/organizations/acme"),
                ("GET", "/api/users/me"),
                ("POST", "/api/admin/users"),
            )
        ]
    assert scope.status_code == 403
    _assert_envelope(scope.json(), "insufficient_scope")
    for resp in (session, nested, *spelled):
        assert resp.status_code == 403
        _assert_envelope(resp.json(), "session_required")


async def test_framework_errors_use_envelope(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        unknown = await http.get("/v1/nothing-here")
        method = await http.get("/v1/chat/completions")
        malformed = await http.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        missing = await http.post("/v1/chat/completions", json={"model": "scripted-chat"})
        not_object = await http.post("/v1/chat/completions", json=[1, 2])
    assert unknown.status_code == 404
    _assert_envelope(unknown.json(), "unknown_route")
    assert method.status_code == 405
    _assert_envelope(method.json(), "method_not_allowed")
    assert malformed.status_code == 400
    _assert_envelope(malformed.json(), "invalid_json")
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "messages"
    assert not_object.status_code == 400


async def test_body_limit_413(sync_gateway: GatewayHarness) -> None:
    state = sync_gateway.app.state.gateway
    small = create_app(state, max_body_bytes=2048)
    import httpx

    transport = httpx.ASGITransport(app=small)
    # A known caller: without a key the answer is the 401, before the body is looked at.
    auth = {"Authorization": f"Bearer {sync_gateway.store.create_key('alice', 'acme')}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=auth) as http:
        big = {"model": "scripted-chat", "messages": [{"role": "user", "content": "x" * 5000}]}
        resp = await http.post("/v1/chat/completions", json=big)

        async def chunks():  # type: ignore[no-untyped-def]
            for _ in range(10):
                yield b"x" * 1000

        chunked = await http.post("/v1/chat/completions", content=chunks())
    assert resp.status_code == 413
    _assert_envelope(resp.json(), "request_too_large")
    assert chunked.status_code == 413


async def test_openapi_docs_served(gateway: GatewayHarness) -> None:
    async with gateway.client() as http:
        spec = await http.get("/openapi.json")
    assert spec.status_code == 200
    assert "/v1/chat/completions" in spec.json()["paths"]


async def test_an_unreachable_database_is_a_retryable_503_not_a_500(
    gateway: GatewayHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key that is not in the auth cache needs the database; while it is down the caller
    gets the retryable 503 (tests/faults/test_database_outage.py does it on PostgreSQL)."""

    def down(*_: object) -> None:
        raise sa.exc.OperationalError("SELECT", {}, ConnectionRefusedError("server down"))

    monkeypatch.setattr(AccountStore, "find_key", down)
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 503
    _assert_envelope(resp.json(), "model_unavailable")
    assert resp.headers["retry-after"] == "1"
