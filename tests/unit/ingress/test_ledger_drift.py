"""Zero drift: the usage ledger bills exactly what the engine produced (docs/reference/README.md,
docs/reference/chat.md).

A mixed workload runs through the in-process app: streamed and non-streamed
chat, legacy completions and responses, ``n>1`` and several prompts, streams
the client leaves, an upstream that breaks after output, one that breaks
before it, and requests refused with 429. The scripted engine keeps its own
count of every generation (``ScriptedEngine.produced``), however it ended;
the ledger must hold one row per request that produced anything, with the
same prompt and completion tokens, and none for the rest.
"""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.billing.records import UsageRecord
from serve_app.billing.store import LedgerStore
from tests.fixtures.gateway import GatewayHarness
from tests.unit.ingress.leaving_client import sse_payloads, stream_then_leave

MODEL = "scripted-chat"
WORDS = " ".join(f"w{i}" for i in range(20))


def chat(content: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def engine_counts(harness: GatewayHarness) -> dict[str, tuple[int, int]]:
    """The engine's own counts per gateway request (engine ids are ``<request id>-<prompt>``)."""
    totals: dict[str, tuple[int, int]] = {}
    for engine_id, (prompt, completion) in harness.engines[MODEL].produced.items():
        request_id = engine_id.rsplit("-", 1)[0]
        before = totals.get(request_id, (0, 0))
        totals[request_id] = (before[0] + prompt, before[1] + completion)
    return totals


async def ledger_rows(harness: GatewayHarness) -> dict[str, UsageRecord]:
    ledger = harness.metering.ledger
    assert ledger is not None
    assert await ledger.flush()
    user = harness.store.get_user("alice")
    assert user is not None
    return {r.request_id: r for r in LedgerStore(ledger.store._db).records_for(user.id)}


async def test_ledger_equals_engine_counts_over_a_mixed_workload(
    gateway: GatewayHarness,
) -> None:
    key = gateway.keys["user"]
    reported: dict[str, tuple[int, int]] = {}  # id -> usage the client was told
    requests_of: dict[str, int] = {}

    async with gateway.client(key) as http:

        async def call(path: str, body: dict[str, Any], requests: int) -> Any:
            resp = await http.post(path, json=body)
            if body.get("stream"):
                events = sse_payloads(resp.text)
                first = events[0].get("response", events[0])
                requests_of[first["id"]] = requests
                return events
            payload = resp.json()
            if resp.status_code == 200:
                usage = payload["usage"]
                prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
                completion = usage.get("completion_tokens", usage.get("output_tokens"))
                reported[payload["id"]] = (prompt, completion)
                requests_of[payload["id"]] = requests
            return payload

        await call("/v1/chat/completions", chat(), 1)
        await call("/v1/chat/completions", chat(n=3, temperature=1), 3)
        events = await call(
            "/v1/chat/completions",
            chat(WORDS, stream=True, n=2, temperature=1, stream_options={"include_usage": True}),
            2,
        )
        usage = events[-1]["usage"]
        reported[events[0]["id"]] = (usage["prompt_tokens"], usage["completion_tokens"])
        await call("/v1/completions", {"model": MODEL, "prompt": ["a b c", "d e"], "n": 2}, 4)
        await call("/v1/completions", {"model": MODEL, "prompt": "x y z", "stream": True}, 1)
        await call("/v1/responses", {"model": MODEL, "input": "one two three"}, 1)
        await call("/v1/responses", {"model": MODEL, "input": WORDS, "stream": True}, 1)
        # The upstream breaks after two words: streamed and not, both billed for the two.
        await call("/v1/chat/completions", chat("a b c d #fail-after 2", stream=True), 1)
        broken = await call("/v1/chat/completions", chat("a b c d #fail-after 2"), 1)
        assert broken["error"]["code"] == "upstream_error"
        failed = await call("/v1/chat/completions", chat("#fail-before"), 1)
        assert failed["error"]["code"] == "upstream_error"  # no output: no row

    # Streams the client leaves part way: billed for what the engine produced until then.
    for body, path, requests in [
        (chat(WORDS, stream=True), "/v1/chat/completions", 1),
        (chat(WORDS, stream=True, n=2, temperature=1), "/v1/chat/completions", 2),
        ({"model": MODEL, "prompt": WORDS, "stream": True}, "/v1/completions", 1),
        ({"model": MODEL, "input": WORDS, "stream": True}, "/v1/responses", 1),
    ]:
        received = await stream_then_leave(gateway.app, key, body, 5, path=path)
        first = sse_payloads(received[0])[0]
        requests_of[first.get("response", first)["id"]] = requests

    # Refused requests (429) start no generation and leave no row.
    limited = gateway.store.create_key("alice", "acme", rpm=1)
    async with gateway.client(limited) as http:
        assert (await http.post("/v1/chat/completions", json=chat())).status_code == 200
        assert (await http.post("/v1/chat/completions", json=chat())).status_code == 429

    engine = engine_counts(gateway)
    rows = await ledger_rows(gateway)
    billed = {rid: (r.prompt_tokens, r.completion_tokens) for rid, r in rows.items()}
    produced = {rid: counts for rid, counts in engine.items() if counts[1] > 0}
    assert billed == produced  # per request: same ids, same prompt and completion tokens
    assert sum(p + c for p, c in billed.values()) == sum(p + c for p, c in produced.values())
    assert len(rows) == 14
    for rid, usage_seen in reported.items():
        assert (rows[rid].prompt_tokens, rows[rid].completion_tokens) == usage_seen
    for rid, requests in requests_of.items():
        assert rows[rid].requests == requests, rid  # n choices count as n requests
    statuses = sorted(r.status for r in rows.values())
    assert statuses == ["aborted"] * 4 + ["ok"] * 8 + ["partial"] * 2


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
async def test_a_token_read_but_never_relayed_is_billed(gateway: GatewayHarness, spec: str) -> None:
    """The first token is read before the answer starts (early errors keep their
    status); a client that leaves with only the role chunk still used it."""
    body = chat(WORDS, stream=True)
    received = await stream_then_leave(gateway.app, gateway.keys["user"], body, 1, spec)
    assert b'"content":"w' not in b"".join(received)  # only the role chunk arrived
    rows = await ledger_rows(gateway)
    assert {rid: (r.prompt_tokens, r.completion_tokens) for rid, r in rows.items()} == (
        engine_counts(gateway)
    )
    assert [(r.status, r.completion_tokens) for r in rows.values()] == [("aborted", 1)]
