"""Limits, quotas and the usage ledger through the real app (docs/reference/README.md,
docs/reference/chat.md, docs/reference/common.md)."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve_app.billing.records import UsageRecord
from serve_app.billing.store import LedgerStore
from serve_app.config import GatewayAppArgs
from serve_app.inference.metering import build_metering
from serve_app.limits.buckets import DAY_MS
from serve_app.limits.memory import InProcessCounterStore
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database
from tests.fixtures.gateway import GatewayHarness, HarnessFactory
from tests.fixtures.limits import ManualClock, StoreFactory
from tests.fixtures.waiting import until as wait_for_condition
from tests.unit.ingress.leaving_client import stream_then_leave

# "user: hello there\nassistant:" is 4 scripted tokens; max_tokens omitted -> 32
# (max_output_tokens): the reservation is 36 tokens, the real usage 4 + 2 = 6.
HELLO = {"model": "scripted-chat", "messages": [{"role": "user", "content": "hello there"}]}


async def post(
    harness: GatewayHarness, key: str, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> httpx.Response:
    async with harness.client(harness.keys.get(key, key)) as http:
        return await http.post(path, json=body)


async def until(condition: Callable[[], bool]) -> None:
    """Wait for in-process head generators to be finalised (Ray closes them at once):
    collected on every look, under a hang guard rather than a 1 s budget."""

    def collected() -> bool:
        gc.collect()
        return condition()

    await wait_for_condition(collected, every_s=0.01)


async def ledger_records(harness: GatewayHarness, user: str) -> dict[str, UsageRecord]:
    ledger = harness.metering.ledger
    assert ledger is not None
    assert await ledger.flush()
    found = harness.store.get_user(user)
    assert found is not None
    return {r.request_id: r for r in LedgerStore(ledger.store._db).records_for(found.id)}


async def test_rpm_2_third_call_is_429_with_the_real_wait(make_gateway: HarnessFactory) -> None:
    clock = ManualClock()
    gw = await make_gateway(counters=InProcessCounterStore(clock=clock))
    gw.store.update_user("alice", rpm=2)
    assert (await post(gw, "user", HELLO)).status_code == 200
    clock.advance(10)
    assert (await post(gw, "user", HELLO)).status_code == 200
    clock.advance(5)
    engine = gw.engines["scripted-chat"]
    resp = await post(gw, "user", HELLO)
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "45"  # the first call leaves the window at 60 s
    error = resp.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    # Refused on the head's acceptance, before the engine was asked for a token.
    assert (len(engine.produced), engine.aborted) == (2, [])
    assert len(await ledger_records(gw, "alice")) == 2  # a 429 is not billed


async def test_key_limit_applies_per_key(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    limited = gw.store.create_key("alice", "acme", rpm=1)
    assert (await post(gw, limited, HELLO)).status_code == 200
    assert (await post(gw, limited, HELLO)).status_code == 429
    assert (await post(gw, "user", HELLO)).status_code == 200  # alice's other key


async def test_platform_default_governs_users_without_their_own(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway({"limits": {"rpm": 1}})
    gw.store.update_user("alice", rpm=3)
    codes = [(await post(gw, "user", HELLO)).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    frank = gw.store.create_key("frank", "acme")
    assert [(await post(gw, frank, HELLO)).status_code for _ in range(2)] == [200, 429]


async def test_unlimited_users_are_unaffected(gateway: GatewayHarness) -> None:
    codes = {(await post(gateway, "user", HELLO)).status_code for _ in range(25)}
    assert codes == {200}


async def test_external_403_comes_before_rate_limiting(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    gw.store.update_user("alice", rpm=1)
    assert (await post(gw, "user", HELLO)).status_code == 200
    resp = await post(gw, "user", {**HELLO, "model": "external-chat"})
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "external_provider_not_enabled"


async def test_daily_quota_is_insufficient_quota_until_midnight(
    make_gateway: HarnessFactory,
) -> None:
    midnight = (round(ManualClock().now * 1000) // DAY_MS + 1) * DAY_MS / 1000
    clock = ManualClock(midnight - 90)
    gw = await make_gateway(counters=InProcessCounterStore(clock=clock))
    gw.store.update_user("alice", daily_tokens=10)
    # Each call reserves 36 and is settled to 6: two fit under 10, the third does not.
    assert (await post(gw, "user", HELLO)).status_code == 200
    assert (await post(gw, "user", {**HELLO, "stream": True})).status_code == 200
    resp = await post(gw, "user", HELLO)
    assert resp.status_code == 429
    assert resp.json()["error"]["code"] == "insufficient_quota"
    assert resp.headers["retry-after"] == "90"
    clock.advance(90)
    assert (await post(gw, "user", HELLO)).status_code == 200


async def test_token_debit_is_settled_to_real_usage(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    gw.store.update_user("alice", tpm=36)  # one reservation fills it; real usage is 6
    codes = []
    for i in range(8):
        body = {**HELLO, "stream": i % 2 == 1}
        codes.append((await post(gw, "user", body)).status_code)
    assert codes == [200] * 6 + [429] * 2  # 6 x 6 = 36 tokens


def _sse(body: str) -> list[Any]:
    out = []
    for block in body.split("\n\n"):
        if block.startswith("data: ") and block != "data: [DONE]":
            out.append(json.loads(block[len("data: ") :]))
    return out


async def test_ledger_matches_engine_counts_over_a_mixed_workload(gateway: GatewayHarness) -> None:
    expected: dict[
        str, tuple[int, int, int, str]
    ] = {}  # id -> prompt, completion, requests, status

    async def json_call(body: dict[str, Any], path: str, requests: int) -> None:
        resp = await post(gateway, "user", body, path)
        usage = resp.json()["usage"]
        expected[resp.json()["id"]] = (
            usage["prompt_tokens"],
            usage["completion_tokens"],
            requests,
            "ok",
        )

    await json_call(HELLO, "/v1/chat/completions", 1)
    await json_call({**HELLO, "n": 3, "temperature": 1}, "/v1/chat/completions", 3)
    await json_call(
        {"model": "scripted-chat", "prompt": ["a b c", "d e"], "n": 2}, "/v1/completions", 4
    )
    resp = await post(
        gateway, "user", {**HELLO, "stream": True, "stream_options": {"include_usage": True}}
    )
    events = _sse(resp.text)
    usage = events[-1]["usage"]
    expected[events[0]["id"]] = (usage["prompt_tokens"], usage["completion_tokens"], 1, "ok")
    broken = {
        **HELLO,
        "stream": True,
        "messages": [{"role": "user", "content": "w1 w2 w3 w4 #fail-after 2"}],
    }
    events = _sse((await post(gateway, "user", broken)).text)
    assert "error" in events[-1]
    expected[events[0]["id"]] = (8, 2, 1, "partial")  # billed for the two words produced
    failed = await post(
        gateway, "user", {**HELLO, "messages": [{"role": "user", "content": "#fail-before"}]}
    )
    assert failed.status_code == 502  # no output: not billed

    records = await ledger_records(gateway, "alice")
    got = {
        rid: (r.prompt_tokens, r.completion_tokens, r.requests, r.status)
        for rid, r in records.items()
    }
    assert got == expected
    assert sum(r.total_tokens for r in records.values()) == sum(
        p + c for p, c, _, _ in expected.values()
    )


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
async def test_aborted_stream_is_billed_for_what_was_produced(
    gateway: GatewayHarness, spec: str
) -> None:
    words = " ".join(f"w{i}" for i in range(20))
    body = {**HELLO, "stream": True, "messages": [{"role": "user", "content": words}]}
    received = await stream_then_leave(gateway.app, gateway.keys["user"], body, 4, spec)
    content_chunks = [c for c in received if b'"content":"' in c and b'"role"' not in c]
    (record,) = (await ledger_records(gateway, "alice")).values()  # billed at once
    assert record.status == "aborted"
    assert record.prompt_tokens == 22
    assert 1 <= record.completion_tokens < 20
    assert record.completion_tokens in (len(content_chunks), len(content_chunks) + 1)
    await until(lambda: bool(gateway.engines["scripted-chat"].aborted))  # head stopped


async def test_tpm_retry_after_is_the_longest_real_wait_of_key_and_user(
    make_gateway: HarnessFactory, make_store: StoreFactory, clock: ManualClock
) -> None:
    """Each call reserves 36 tokens and settles to 6; every bucket counts settled usage."""
    gw = await make_gateway(counters=make_store(clock=clock))
    gw.store.update_user("alice", tpm=15)
    key1 = gw.store.create_key("alice", "acme", tpm=10)
    key2 = gw.keys["user"]
    assert (await post(gw, key2, HELLO)).status_code == 200  # t=0   user 6
    clock.advance(20)
    assert (await post(gw, key1, HELLO)).status_code == 200  # t=20  key1 6, user 12
    clock.advance(20)
    assert (await post(gw, key1, HELLO)).status_code == 200  # t=40  key1 12, user 18
    clock.advance(5)
    # t=45: key1 has room once t=20 leaves (35 s); the user once t=0 leaves (15 s).
    by_key = await post(gw, key1, HELLO)
    assert (by_key.status_code, by_key.headers["retry-after"]) == (429, "35")
    assert "10 tokens per minute for this API key" in by_key.json()["error"]["message"]
    by_user = await post(gw, key2, HELLO)
    assert (by_user.status_code, by_user.headers["retry-after"]) == (429, "15")
    assert "15 tokens per minute for this user" in by_user.json()["error"]["message"]
    clock.advance(15)  # t=60: the first call left the window
    assert (await post(gw, key2, HELLO)).status_code == 200
    assert (await post(gw, key1, HELLO)).headers["retry-after"] == "20"


async def test_replicas_without_redis_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = GatewaySettings(state_dir=tmp_path, redis_url=None)
    database = Database(f"sqlite:///{tmp_path / 'gw.db'}")
    for replicas, warned in ((1, False), (4, True)):
        caplog.clear()
        config = GatewayAppArgs.model_validate({"ingress": {"num_replicas": replicas}})
        metering = build_metering(config, database, settings)
        await metering.aclose()
        assert ("without GATEWAY_REDIS_URL" in caplog.text) is warned


async def test_every_text_route_shares_the_limits(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    gw.store.update_user("alice", rpm=1)
    assert (await post(gw, "user", HELLO)).status_code == 200
    refused = [
        await post(gw, "user", {"model": "scripted-chat", "prompt": "a"}, "/v1/completions"),
        await post(gw, "user", {"model": "scripted-chat", "input": "a"}, "/v1/responses"),
        await post(
            gw, "user", {"model": "scripted-chat", "input": "a", "stream": True}, "/v1/responses"
        ),
        await post(gw, "user", {**HELLO, "stream": True}),
    ]
    assert [(r.status_code, r.json()["error"]["code"]) for r in refused] == [
        (429, "rate_limit_exceeded")
    ] * 4
    assert all(int(r.headers["retry-after"]) > 0 for r in refused)


async def test_an_external_request_over_the_limit_never_calls_the_provider(
    make_gateway: HarnessFactory,
) -> None:
    """The fixture's provider is unreachable: any call to it would end in a 503."""
    gw = await make_gateway()
    gw.store.update_user("bob", rpm=1)
    body = {**HELLO, "model": "external-chat"}
    first = await post(gw, "external", body)
    assert first.json()["error"]["code"] == "model_unavailable"  # it tried the provider
    refused = await post(gw, "external", body)
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "rate_limit_exceeded")
