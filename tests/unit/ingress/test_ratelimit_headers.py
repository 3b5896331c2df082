"""OpenAI's x-ratelimit-* headers and Retry-After, read as the openai SDK reads them."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.limits.buckets import BucketSpec
from serve_app.limits.headers import format_reset, rate_limit_headers
from serve_app.limits.memory import InProcessCounterStore
from tests.fixtures.gateway import HarnessFactory
from tests.fixtures.limits import ManualClock, StoreFactory

MESSAGES: Any = [{"role": "user", "content": "hello there"}]
# "user: hello there\nassistant:" is 4 scripted tokens; max_tokens 32 (max_output_tokens):
# admission reserves 4 + 32 = 36 tokens.
RESERVED = 36


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (20, "20ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (60_000, "1m0s"),
        (360_000, "6m0s"),
        (86_399_000, "23h59m59s"),
        (3_600_000, "1h0m0s"),
    ],
)
def test_reset_is_written_as_a_go_duration(ms: int, text: str) -> None:
    assert format_reset(ms) == text


async def _limited(make_gateway: HarnessFactory, clock: ManualClock) -> Any:
    gw = await make_gateway(counters=InProcessCounterStore(clock=clock))
    # Key RPM 5 and user RPM 3: the user's is the tighter. Tokens: key TPM 500,
    # user TPM 1000 and a daily quota of 10 000: the key's TPM is the tightest.
    key = gw.store.create_key("alice", "acme", rpm=5, tpm=500)
    gw.store.update_user("alice", rpm=3, tpm=1000, daily_tokens=10_000)
    return gw, key


async def test_chat_json_and_stream_carry_the_tightest_buckets(
    make_gateway: HarnessFactory,
) -> None:
    clock = ManualClock()
    gw, key = await _limited(make_gateway, clock)
    client = gw.openai(key)
    raw = await client.chat.completions.with_raw_response.create(
        model="scripted-chat", messages=MESSAGES
    )
    assert raw.status_code == 200
    assert raw.headers["x-ratelimit-limit-requests"] == "3"
    assert raw.headers["x-ratelimit-remaining-requests"] == "2"
    assert raw.headers["x-ratelimit-reset-requests"] == "1m0s"
    assert raw.headers["x-ratelimit-limit-tokens"] == "500"
    assert raw.headers["x-ratelimit-remaining-tokens"] == str(500 - RESERVED)
    assert raw.headers["x-ratelimit-reset-tokens"] == "1m0s"
    raw.parse()  # the body is still a chat completion

    clock.advance(1.5)
    streamed = await client.chat.completions.with_raw_response.create(
        model="scripted-chat", messages=MESSAGES, stream=True
    )
    assert streamed.headers["x-ratelimit-remaining-requests"] == "1"
    # The first request settled to its real usage (4 + 2 tokens), the second reserves 36.
    assert int(streamed.headers["x-ratelimit-remaining-tokens"]) == 500 - 6 - RESERVED
    assert streamed.headers["x-ratelimit-reset-requests"] == "1m0s"
    async for _ in streamed.parse():
        pass


async def test_the_429_carries_the_headers_and_the_real_wait(
    make_gateway: HarnessFactory,
) -> None:
    clock = ManualClock()
    gw, key = await _limited(make_gateway, clock)
    client = gw.openai(key)
    for _ in range(3):
        await client.chat.completions.create(model="scripted-chat", messages=MESSAGES)
        clock.advance(2.5)
    with pytest.raises(Exception) as caught:
        await client.chat.completions.with_raw_response.create(
            model="scripted-chat", messages=MESSAGES
        )
    response = caught.value.response  # type: ignore[attr-defined]
    assert response.status_code == 429
    # The oldest call leaves the 60 s window 7.5 s from now: 52.5 s -> 53 whole seconds.
    assert response.headers["retry-after"] == "53"
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert response.headers["x-ratelimit-limit-requests"] == "3"
    # Full again when the newest entry leaves: 60 - 2.5 s.
    assert response.headers["x-ratelimit-reset-requests"] == "57.5s"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "scripted-chat", "prompt": "hello"}),
        ("/v1/completions", {"model": "scripted-chat", "prompt": "hello", "stream": True}),
        ("/v1/responses", {"model": "scripted-chat", "input": "hello"}),
        ("/v1/responses", {"model": "scripted-chat", "input": "hello", "stream": True}),
    ],
)
async def test_every_text_route_sends_them(
    make_gateway: HarnessFactory, path: str, body: dict[str, Any]
) -> None:
    gw, key = await _limited(make_gateway, ManualClock())
    async with gw.client(key) as http:
        resp = await http.post(path, json=body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-ratelimit-remaining-requests"] == "2"
    assert 0 < int(resp.headers["x-ratelimit-remaining-tokens"]) < 500


async def test_no_limit_no_headers(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    async with gw.client(gw.keys["user"]) as http:
        resp = await http.post(
            "/v1/chat/completions", json={"model": "scripted-chat", "messages": MESSAGES}
        )
    assert resp.status_code == 200
    assert not [h for h in resp.headers if h.startswith("x-ratelimit-")]


async def test_both_backends_report_the_same_states(make_store: StoreFactory) -> None:
    store = make_store()
    rpm = BucketSpec("requests", "{u:a}:rpm:user", 2, "user")
    tpm = BucketSpec("tokens", "{u:a}:tpm:user", 100, "user")
    day = BucketSpec("daily", "{u:a}:day", 1000, "user")
    first = await store.admit("r1", [rpm, tpm, day], 30)
    assert [(s.used, s.remaining, s.reset_ms) for s in first.states][:2] == [
        (1, 1, 60_000),
        (30, 70, 60_000),
    ]
    assert first.states[2].used == 30
    second = await store.admit("r2", [rpm, tpm, day], 30)
    third = await store.admit("r3", [rpm, tpm, day], 30)
    assert type(third).__name__ == "Denial"
    assert [s.used for s in second.states] == [2, 60, 60]
    assert [s.used for s in third.states] == [2, 60, 60]
    headers = rate_limit_headers(third.states)
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-remaining-tokens"] == "40"
