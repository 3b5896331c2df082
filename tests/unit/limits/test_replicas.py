"""Four gateway replicas (four independent Redis stores) share one set of limits.

The store-level cases measure the counters alone; the last case runs four
whole gateway apps (auth, head, admission, ledger) against one Redis.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from serve_app.billing.store import LedgerStore
from serve_app.limits.buckets import BucketSpec, Denial, Ticket
from serve_app.limits.redis_store import RedisCounterStore
from tests.fixtures.gateway import build_harness, chat_burst, start_heads
from tests.fixtures.limits import StoreFactory
from tests.fixtures.waiting import GUARD_S

REPLICAS = 4


async def test_four_replicas_admit_no_more_than_n_per_minute(
    make_redis_store: StoreFactory,
) -> None:
    replicas = [make_redis_store() for _ in range(REPLICAS)]
    bucket = BucketSpec("requests", "{u:u1}:rpm:user", 25, "user")
    calls = [replicas[i % REPLICAS].admit(f"r{i}", [bucket], 0) for i in range(REPLICAS * 60)]
    outcomes = await asyncio.gather(*calls)
    assert sum(isinstance(o, Ticket) for o in outcomes) == 25


async def test_four_replicas_hold_the_limit_in_every_sliding_window(
    make_redis_store: StoreFactory,
) -> None:
    """Under steady load the limit is reached, and never exceeded, in any window.

    The load runs until three windows' worth was admitted (Redis's clock says when a
    window ends), not for a fixed 3.2 s a slow machine might spend on fewer attempts.
    """
    window_ms, limit = 1000, 10
    replicas = [make_redis_store(window_s=window_ms / 1000) for _ in range(REPLICAS)]
    bucket = BucketSpec("requests", "{u:u1}:rpm:user", limit, "user")
    admitted_at: list[int] = []
    guard = time.monotonic() + GUARD_S

    async def caller(replica: int, n: int) -> None:
        rng = random.Random(replica * 100 + n)
        i = 0
        while len(admitted_at) < 3 * limit:
            assert time.monotonic() < guard, f"{len(admitted_at)} admitted (hang guard)"
            i += 1
            outcome = await replicas[replica].admit(f"{replica}-{n}-{i}", [bucket], 0)
            if isinstance(outcome, Ticket):
                admitted_at.append(outcome.admitted_at_ms)  # Redis's own clock
            await asyncio.sleep(rng.random() / 100)

    await asyncio.gather(*(caller(r, n) for r in range(REPLICAS) for n in range(8)))
    admitted_at.sort()
    busiest = max(sum(1 for u in admitted_at if t - window_ms < u <= t) for t in admitted_at)
    assert busiest == limit


async def test_fifty_callers_on_four_replicas_share_one_token_quota(
    make_redis_store: StoreFactory,
) -> None:
    replicas = [make_redis_store() for _ in range(REPLICAS)]
    limit, max_cost = 5000, 120
    buckets = [
        BucketSpec("tokens", "{u:u1}:tpm:user", limit, "user"),
        BucketSpec("daily", "{u:u1}:day", limit, "user"),
    ]
    spent: list[int] = []

    async def caller(n: int) -> None:
        rng = random.Random(n)
        store = replicas[n % REPLICAS]
        i = 0
        while True:
            i += 1
            cost = rng.randint(10, max_cost)
            outcome = await store.admit(f"c{n}-{i}", buckets, cost)
            if isinstance(outcome, Denial):
                return
            await asyncio.sleep(rng.random() / 200)
            await store.settle(outcome, cost)  # worst case: every request uses it all
            spent.append(cost)

    await asyncio.gather(*(caller(n) for n in range(50)))
    assert limit <= sum(spent) < limit + max_cost


async def test_four_gateway_apps_admit_n_per_minute_over_http(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """The whole request path: four apps (one database, one Redis, a pool each)."""
    limit = 7
    replicas = [
        build_harness(
            tmp_path / "gw.db",
            counters=RedisCounterStore.from_url(redis_url, prefix=redis_prefix),
        )
        for _ in range(REPLICAS)
    ]
    try:
        for harness in replicas:
            await start_heads(harness)
        key = replicas[0].store.create_key("alice", "acme")
        replicas[0].store.update_user("alice", rpm=limit)
        codes = await chat_burst(replicas, key, REPLICAS * 10)
        assert sorted(codes) == [200] * limit + [429] * (REPLICAS * 10 - limit)
        ledger = replicas[0].metering.ledger
        assert ledger is not None
        for harness in replicas:
            flushed = harness.metering.ledger
            assert flushed is not None and await flushed.flush()
        user = replicas[0].store.get_user("alice")
        assert user is not None
        assert len(LedgerStore(ledger.store._db).records_for(user.id)) == limit
    finally:
        for harness in replicas:
            await harness.aclose()
