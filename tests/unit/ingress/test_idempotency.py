"""Retries with an ``Idempotency-Key`` through the real app: generated once, billed once."""

from __future__ import annotations

from typing import Any

from serve_app.billing.store import LedgerStore
from tests.fixtures.gateway import GatewayHarness
from tests.unit.ingress.leaving_client import stream_then_leave

WORDS = " ".join(f"w{i}" for i in range(12))
CHAT = {"model": "scripted-chat", "messages": [{"role": "user", "content": WORDS}]}


async def billed(harness: GatewayHarness) -> dict[str, tuple[int, int, str]]:
    ledger = harness.metering.ledger
    assert ledger is not None
    assert await ledger.flush()
    user = harness.store.get_user("alice")
    assert user is not None
    return {
        r.request_id: (r.prompt_tokens, r.completion_tokens, r.status)
        for r in LedgerStore(ledger.store._db).records_for(user.id)
    }


async def post(harness: GatewayHarness, body: dict[str, Any], key: str | None) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    async with harness.client(harness.keys["user"]) as http:
        return await http.post("/v1/chat/completions", json=body, headers=headers)


async def test_a_retried_answer_is_replayed_not_generated_again(gateway: GatewayHarness) -> None:
    gateway.store.update_user("alice", rpm=2)
    engine = gateway.engines["scripted-chat"]
    first = await post(gateway, CHAT, "chat-1")
    retry = await post(gateway, CHAT, "chat-1")
    assert retry.status_code == 200 and retry.headers["idempotent-replayed"] == "true"
    assert retry.json() == first.json()  # same id, same text, same usage
    streamed = {**CHAT, "stream": True}
    first_stream = await post(gateway, streamed, "chat-2")
    retry_stream = await post(gateway, streamed, "chat-2")
    assert retry_stream.text == first_stream.text
    assert retry_stream.headers["content-type"].startswith("text/event-stream")
    assert len(engine.produced) == 2  # two generations for four answers
    assert len(await billed(gateway)) == 2
    # Replays used no rate limit either: RPM 2 was spent by the two generations only.
    assert (await post(gateway, CHAT, None)).status_code == 429


async def test_an_abandoned_attempt_is_billed_once_and_its_retry_runs(
    gateway: GatewayHarness,
) -> None:
    """The client left the first attempt: nothing to replay; the retry generates anew,
    and each attempt is billed for what it produced, once."""
    key = gateway.keys["user"]
    body = {**CHAT, "stream": True}
    received = await stream_then_leave(gateway.app, key, body, 4, headers={"Idempotency-Key": "s"})
    assert received
    retry = await post(gateway, body, "s")
    assert retry.status_code == 200 and "idempotent-replayed" not in retry.headers
    assert (await post(gateway, body, "s")).headers["idempotent-replayed"] == "true"
    rows = await billed(gateway)
    assert sorted(status for _, _, status in rows.values()) == ["aborted", "ok"]
    produced = gateway.engines["scripted-chat"].produced
    assert sorted((p, c) for p, c, _ in rows.values()) == sorted(produced.values())


async def test_without_a_key_every_request_is_its_own(gateway: GatewayHarness) -> None:
    answers = [(await post(gateway, CHAT, None)).json()["id"] for _ in range(2)]
    assert len(set(answers)) == 2
    assert len(await billed(gateway)) == 2


async def test_a_revoked_key_gets_401_not_the_stored_answer(gateway: GatewayHarness) -> None:
    key = gateway.store.create_key("alice", "acme")
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "revoke-me"}
    async with gateway.client() as http:
        first = await http.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert first.status_code == 200
        assert gateway.store.revoke_key(key)
        retry = await http.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert retry.status_code == 401, retry.text
    assert retry.json()["error"]["code"] == "invalid_api_key"
    assert "idempotent-replayed" not in retry.headers


async def test_another_organization_never_gets_the_stored_answer(gateway: GatewayHarness) -> None:
    """Same Idempotency-Key, same body, same route, another organization's key: its own run."""
    mallory = gateway.store.create_key("mallory", "evil-org")
    engine = gateway.engines["scripted-chat"]
    first = await post(gateway, CHAT, "shared-key")
    async with gateway.client(mallory) as http:
        other = await http.post(
            "/v1/chat/completions", json=CHAT, headers={"Idempotency-Key": "shared-key"}
        )
    assert other.status_code == 200 and "idempotent-replayed" not in other.headers
    assert other.json()["id"] != first.json()["id"]
    assert len(engine.produced) == 2


def test_slots_are_keyed_by_the_authenticated_caller_not_the_header() -> None:
    """A caller without an Authorization header (a dashboard session) or with one spelled
    differently still gets its own slot: the organization and key id decide."""
    from serve_app.auth.principal import Principal
    from serve_app.ingress.idempotency import _slot
    from serve_app.requests.deps import PRINCIPAL_SCOPE_KEY

    def scope(org: str, key_id: str, header: bytes) -> dict[str, Any]:
        caller = Principal(key_id, "u", org, "member", frozenset({"inference"}))
        return {
            "path": "/v1/chat/completions",
            "headers": [(b"authorization", header)] if header else [],
            PRINCIPAL_SCOPE_KEY: (caller, 0.0),
        }

    a = _slot(scope("org-a", "key-1", b""), "k")
    assert _slot(scope("org-b", "key-2", b""), "k") != a
    assert _slot(scope("org-a", "key-3", b""), "k") != a
    assert _slot(scope("org-a", "key-1", b"bearer  gwk_x"), "k") == a
    assert _slot(scope("org-a", "key-1", b""), "other") != a
