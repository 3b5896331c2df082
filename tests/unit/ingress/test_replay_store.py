"""Idempotency slots on both backends, and retries that reach another replica.

The in-process store and real Redis run the same cases; the middleware runs
over a small counting app so what is measured is only "how often did the app
run, and what did each attempt get back".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from serve_app.ingress.idempotency import IdempotencyMiddleware
from serve_app.requests.replays import (
    Answered,
    Claimed,
    InFlight,
    InProcessReplayStore,
    RedisReplayStore,
    ReplayStore,
    StoredAnswer,
)
from tests.fixtures.limits import ManualClock

ANSWER = StoredAnswer(200, [("content-type", "application/json")], b'{"id":"x"}')


@pytest.fixture(params=["memory", "redis"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[list[ReplayStore]]:
    """Two stores of one backend that share their slots (two gateway replicas)."""
    made: list[ReplayStore] = []
    if request.param == "memory":
        one = InProcessReplayStore()
        made = [one, one]  # one process: one store
    else:
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")
        made = [RedisReplayStore.from_url(url, prefix=prefix) for _ in range(2)]
    yield made
    for store in {id(s): s for s in made}.values():
        await store.aclose()


async def test_claim_complete_and_replay(stores: list[ReplayStore]) -> None:
    a, b = stores
    claimed = await a.claim("s1", "fp", 30)
    assert isinstance(claimed, Claimed)
    assert await b.claim("s1", "fp", 30) == InFlight("fp")
    await b.complete("s1", "not-the-token", ANSWER, 60)  # only the holder may complete
    assert await b.claim("s1", "fp", 30) == InFlight("fp")
    await a.complete("s1", claimed.token, ANSWER, 60)
    assert await b.claim("s1", "other", 30) == Answered("fp", ANSWER)


async def test_a_released_claim_runs_again(stores: list[ReplayStore]) -> None:
    a, b = stores
    first = await a.claim("s1", "fp", 30)
    assert isinstance(first, Claimed)
    await b.release("s1", "not-the-token")
    assert isinstance(await b.claim("s1", "fp", 30), InFlight)
    await a.release("s1", first.token)
    second = await b.claim("s1", "fp", 30)
    assert isinstance(second, Claimed) and second.token != first.token


@pytest.fixture(params=["memory", "redis"])
async def leased(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[list[ReplayStore], Callable[[float], Awaitable[None]]]]:
    """Two stores sharing their slots, and how time passes for their leases.

    In process the store's clock is the test's and moves at once. Redis expires keys on
    its own clock: there the time passes as a real sleep, which only ever waits at least
    as long as asked, so a slow machine can make a lease older but never younger than
    the test says (every lease that must still hold is far longer than the sleeps).
    """
    if request.param == "memory":
        clock = ManualClock(0.0)
        one = InProcessReplayStore(clock=clock)

        async def advance(seconds: float) -> None:
            clock.advance(seconds)

        yield [one, one], advance
        await one.aclose()
    else:
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")
        made = [RedisReplayStore.from_url(url, prefix=prefix) for _ in range(2)]
        yield list[ReplayStore](made), asyncio.sleep
        for store in made:
            await store.aclose()


async def test_a_claim_whose_holder_died_expires_with_its_lease(
    leased: tuple[list[ReplayStore], Callable[[float], Awaitable[None]]],
) -> None:
    (a, b), time_passes = leased
    # The first lease must still be running when it is renewed: 1 s for one round trip.
    first = await a.claim("s1", "fp", 1.0)
    assert isinstance(first, Claimed)
    await a.renew("s1", first.token, 60)
    await time_passes(1.1)  # past the first lease
    assert isinstance(await b.claim("s1", "fp", 0.2), InFlight)  # renewed: still held
    await a.renew("s1", first.token, 0.1)  # the holder's last renewal; then it dies
    await time_passes(0.2)
    assert isinstance(await b.claim("s1", "fp", 30), Claimed)  # not renewed: free again
    await a.complete("s1", first.token, ANSWER, 60)  # too late: the slot is someone else's
    assert isinstance(await b.claim("s1", "fp", 30), InFlight)


async def test_in_process_answers_expire_and_stay_within_budget() -> None:
    clock = ManualClock(0.0)
    store = InProcessReplayStore(max_bytes=3 * (len(ANSWER.body) + 256), clock=clock)
    for i in range(5):
        claimed = await store.claim(f"s{i}", "fp", 30)
        assert isinstance(claimed, Claimed)
        await store.complete(f"s{i}", claimed.token, ANSWER, 60)
    pending = await store.claim("busy", "fp", 1000)
    kept = [isinstance(await store.claim(f"s{i}", "fp", 30), Answered) for i in range(5)]
    assert kept == [False, False, True, True, True]  # the oldest answers went first
    clock.advance(61)
    assert isinstance(await store.claim("s4", "fp", 30), Claimed)  # kept 60 s, no longer
    assert isinstance(pending, Claimed)
    assert isinstance(await store.claim("busy", "fp", 30), InFlight)  # never trimmed


class CountingApp:
    """An ASGI app that answers with its call count after ``delay_s``."""

    def __init__(self, delay_s: float = 0.0, status: int = 200) -> None:
        self.calls = 0
        self.delay_s = delay_s
        self.status = status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        number = self.calls
        body = await Request(scope, receive).body()
        await asyncio.sleep(self.delay_s)
        response: Response = JSONResponse(
            {"call": number, "bytes": len(body)}, status_code=self.status
        )
        await response(scope, receive, send)


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway.test",
        headers={"Authorization": "Bearer k1"},
    )


async def test_a_retry_on_another_replica_gets_the_first_answer(
    stores: list[ReplayStore],
) -> None:
    app = CountingApp()
    replicas = [IdempotencyMiddleware(app, store) for store in stores]
    headers = {"Idempotency-Key": "retry-1"}
    async with client(replicas[0]) as one, client(replicas[1]) as two:
        first = await one.post("/v1/chat/completions", json={"q": 1}, headers=headers)
        again = await two.post("/v1/chat/completions", json={"q": 1}, headers=headers)
        other_route = await two.post("/v1/completions", json={"q": 1}, headers=headers)
        reused = await two.post("/v1/chat/completions", json={"q": 2}, headers=headers)
    assert first.json() == again.json() == {"call": 1, "bytes": 7}
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert other_route.json()["call"] == 2  # a key is scoped to its route
    assert reused.status_code == 400
    assert reused.json()["error"]["code"] == "idempotency_key_reused"
    assert app.calls == 2


async def test_concurrent_attempts_run_once(stores: list[ReplayStore]) -> None:
    app = CountingApp(delay_s=0.3)
    replicas = [IdempotencyMiddleware(app, store, poll_s=0.02) for store in stores]
    headers = {"Idempotency-Key": "race"}

    async def attempt(i: int) -> httpx.Response:
        async with client(replicas[i % 2]) as http:
            return await http.post("/v1/responses", json={"q": 1}, headers=headers)

    answers = await asyncio.gather(*(attempt(i) for i in range(6)))
    assert app.calls == 1
    assert {r.json()["call"] for r in answers} == {1}


async def test_failures_are_not_kept_and_other_callers_have_their_own_keys(
    stores: list[ReplayStore],
) -> None:
    app = CountingApp(status=502)
    replica = IdempotencyMiddleware(app, stores[0])
    headers = {"Idempotency-Key": "k"}
    async with client(replica) as http:
        assert (
            await http.post("/v1/chat/completions", json={}, headers=headers)
        ).status_code == 502
        assert (
            await http.post("/v1/chat/completions", json={}, headers=headers)
        ).status_code == 502
        assert app.calls == 2  # an error is not an answer to replay: the retry ran
        app.status = 200
        assert (await http.post("/v1/chat/completions", json={}, headers=headers)).json()[
            "call"
        ] == 3
        other = {"Authorization": "Bearer k2", **headers}
        assert (await http.post("/v1/chat/completions", json={}, headers=other)).json()["call"] == 4
        assert (await http.post("/v1/chat/completions", json={}, headers=headers)).json()[
            "call"
        ] == 3


async def test_uploads_match_whatever_their_multipart_boundary(
    stores: list[ReplayStore],
) -> None:
    """SDKs build a new random boundary for every attempt of an upload."""
    app = CountingApp()
    replica = IdempotencyMiddleware(app, stores[0])
    files = {"file": ("a.wav", b"RIFF" + b"\0" * 200_000, "audio/wav")}
    headers = {"Idempotency-Key": "upload"}
    async with client(replica) as http:
        first = await http.post(
            "/v1/audio/transcriptions", files=files, data={"model": "m"}, headers=headers
        )
        again = await http.post(
            "/v1/audio/transcriptions", files=files, data={"model": "m"}, headers=headers
        )
        changed = await http.post(
            "/v1/audio/transcriptions", files=files, data={"model": "m2"}, headers=headers
        )
    content_type = "content-type"
    assert first.request.headers[content_type] != again.request.headers[content_type]  # boundary
    assert first.json() == again.json() and app.calls == 1
    assert changed.status_code == 400


async def test_keys_are_checked_and_other_requests_pass_untouched() -> None:
    app = CountingApp()
    replica = IdempotencyMiddleware(app, InProcessReplayStore())
    async with client(replica) as http:
        bad = await http.post("/v1/chat/completions", json={}, headers={"Idempotency-Key": "a b"})
        assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_idempotency_key")
        for _ in range(2):  # without a key, or outside /v1/: every request runs
            await http.post("/v1/chat/completions", json={})
            await http.post("/api/dedicated", json={}, headers={"Idempotency-Key": "d"})
    assert app.calls == 4
