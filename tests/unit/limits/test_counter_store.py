"""Every counter rule, once on the in-process backend and once on real Redis."""

from __future__ import annotations

import asyncio
import random

from serve_app.limits.buckets import DAY_MS, BucketSpec, Denial, Ticket
from tests.fixtures.limits import ManualClock, StoreFactory

RPM = BucketSpec("requests", "{u:u1}:rpm:user", 2, "user")


def tokens(limit: int, key: str = "{u:u1}:tpm:user") -> BucketSpec:
    return BucketSpec("tokens", key, limit, "user")


def daily(limit: int) -> BucketSpec:
    return BucketSpec("daily", "{u:u1}:day", limit, "user")


async def test_rpm_holds_and_retry_after_is_the_real_wait(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store()
    assert isinstance(await store.admit("a", [RPM], 0), Ticket)  # t = 0
    clock.advance(10)
    assert isinstance(await store.admit("b", [RPM], 0), Ticket)  # t = 10
    clock.advance(10)
    denied = await store.admit("c", [RPM], 0)  # t = 20: "a" leaves at 60
    assert isinstance(denied, Denial)
    assert (denied.retry_after_ms, denied.retry_after_s) == (40_000, 40)
    clock.advance(39.5)  # t = 59.5
    denied = await store.admit("c", [RPM], 0)
    assert isinstance(denied, Denial) and denied.retry_after_s == 1  # 0.5 s, rounded up
    clock.advance(0.5)  # t = 60: "a" is out of the window
    assert isinstance(await store.admit("c", [RPM], 0), Ticket)
    denied = await store.admit("d", [RPM], 0)
    assert isinstance(denied, Denial) and denied.retry_after_ms == 10_000  # "b" leaves at 70


async def test_denied_requests_consume_nothing(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store()
    one = BucketSpec("requests", "{u:u1}:rpm:key:k", 1, "key")
    assert isinstance(await store.admit("a", [one], 0), Ticket)
    for i in range(20):
        clock.advance(1)
        assert isinstance(await store.admit(f"x{i}", [one], 0), Denial)
    clock.advance(40)  # exactly 60 s after "a"
    assert isinstance(await store.admit("b", [one], 0), Ticket)


async def test_sliding_window_is_exact_in_every_window(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    """Admitted iff fewer than N admissions in the last 60 s; the wait is exact."""
    store = make_store()
    limit, window_ms = 5, 60_000
    bucket = BucketSpec("requests", "{u:u1}:rpm:user", limit, "user")
    rng = random.Random(7)
    start_ms = round(clock.now * 1000)
    admitted: list[int] = []
    for i in range(150):
        clock.advance(rng.choice([0.0, 0.25, 1.0, 3.0, 7.5, 20.0]))
        now_ms = round(clock.now * 1000)
        in_window = [t for t in admitted if t > now_ms - window_ms]
        outcome = await store.admit(f"r{i}", [bucket], 0)
        if len(in_window) < limit:
            assert isinstance(outcome, Ticket), i
            admitted.append(now_ms)
        else:
            assert isinstance(outcome, Denial), i
            oldest_needed = in_window[len(in_window) - limit]
            assert outcome.retry_after_ms == oldest_needed + window_ms - now_ms
    assert round(clock.now * 1000) - start_ms > 5 * window_ms
    for t in admitted:  # no window of 60 s holds more than the limit
        assert sum(1 for u in admitted if t - window_ms < u <= t) <= limit


async def test_tokens_admit_below_limit_and_settling_frees_room(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store()
    tpm = tokens(100)
    first = await store.admit("a", [tpm], 60)
    second = await store.admit("b", [tpm], 60)  # 60 < 100: admitted, now 120 reserved
    assert isinstance(first, Ticket) and isinstance(second, Ticket)
    clock.advance(5)
    denied = await store.admit("c", [tpm], 10)
    assert isinstance(denied, Denial) and denied.retry_after_ms == 55_000
    await store.settle(second, 10)  # real usage: 60 + 10 = 70 < 100
    assert isinstance(await store.admit("c", [tpm], 10), Ticket)


async def test_tokens_retry_after_weighs_entries(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store()
    tpm = tokens(100)
    first = await store.admit("a", [tpm], 50)
    assert isinstance(first, Ticket)
    await store.settle(first, 30)
    clock.advance(5)
    assert isinstance(await store.admit("b", [tpm], 80), Ticket)  # 30 < 100 -> 110
    clock.advance(5)
    denied = await store.admit("c", [tpm], 1)
    # Dropping "a" (30) leaves 80 < 100: room returns when "a" leaves, at t = 60.
    assert isinstance(denied, Denial) and denied.retry_after_ms == 50_000
    clock.advance(49.999)
    assert isinstance(await store.admit("c", [tpm], 1), Denial)
    clock.advance(0.001)
    assert isinstance(await store.admit("c", [tpm], 1), Ticket)


async def test_daily_quota_resets_at_midnight_utc(make_store: StoreFactory) -> None:
    midnight_s = (round(ManualClock().now * 1000) // DAY_MS + 1) * DAY_MS / 1000
    clock = ManualClock(midnight_s - 30)  # 23:59:30 UTC
    store = make_store(clock=clock)
    quota = daily(100)
    assert isinstance(await store.admit("a", [quota], 100), Ticket)
    denied = await store.admit("b", [quota], 1)
    assert isinstance(denied, Denial) and denied.bucket.kind == "daily"
    assert denied.retry_after_s == 30
    clock.advance(29.999)
    assert isinstance(await store.admit("b", [quota], 1), Denial)
    clock.advance(0.001)  # 00:00:00 UTC: a new day
    assert isinstance(await store.admit("b", [quota], 1), Ticket)


async def test_daily_settle_returns_unused_tokens(make_store: StoreFactory) -> None:
    store = make_store()
    quota = daily(100)
    first = await store.admit("a", [quota], 100)
    assert isinstance(first, Ticket)
    assert isinstance(await store.admit("b", [quota], 50), Denial)
    await store.settle(first, 40)
    assert isinstance(await store.admit("b", [quota], 50), Ticket)  # 90 used
    assert isinstance(await store.admit("c", [quota], 50), Ticket)  # 90 < 100 -> 140
    assert isinstance(await store.admit("d", [quota], 1), Denial)


async def test_all_buckets_reserve_or_none(make_store: StoreFactory) -> None:
    store = make_store()
    key_rpm = BucketSpec("requests", "{u:u1}:rpm:key:k", 5, "key")
    tpm = tokens(10)
    assert isinstance(await store.admit("a", [key_rpm, tpm], 10), Ticket)
    for i in range(3):  # refused by the token bucket: must not use the key's RPM
        assert isinstance(await store.admit(f"x{i}", [key_rpm, tpm], 10), Denial)
    admitted = [await store.admit(f"b{i}", [key_rpm], 0) for i in range(5)]
    assert [isinstance(o, Ticket) for o in admitted] == [True] * 4 + [False]


async def test_reported_denial_is_daily_else_longest_wait(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store()
    short = BucketSpec("requests", "{u:u1}:rpm:key:k", 1, "key")
    long = BucketSpec("requests", "{u:u1}:rpm:user", 1, "user")
    assert isinstance(await store.admit("a", [long], 0), Ticket)
    clock.advance(30)
    assert isinstance(await store.admit("b", [short], 0), Ticket)
    denied = await store.admit("c", [short, long], 0)
    assert isinstance(denied, Denial) and denied.bucket == short  # waits 60 s vs 30 s
    assert denied.retry_after_ms == 60_000
    quota = daily(1)
    assert isinstance(await store.admit("d", [quota], 1), Ticket)
    denied = await store.admit("e", [short, quota], 0)
    assert isinstance(denied, Denial) and denied.bucket == quota


async def test_concurrent_callers_never_exceed_rpm(make_store: StoreFactory) -> None:
    store = make_store(clock=None)
    bucket = BucketSpec("requests", "{u:u1}:rpm:user", 20, "user")
    outcomes = await asyncio.gather(*(store.admit(f"r{i}", [bucket], 0) for i in range(200)))
    assert sum(isinstance(o, Ticket) for o in outcomes) == 20


async def test_fifty_callers_sharing_a_quota_overspend_at_most_one_request(
    make_store: StoreFactory,
) -> None:
    store = make_store(clock=None)
    limit, max_cost = 3000, 100
    buckets = [daily(limit), tokens(limit)]
    spent: list[int] = []

    async def caller(seed: int) -> None:
        rng = random.Random(seed)
        while True:
            cost = rng.randint(20, max_cost)
            outcome = await store.admit(f"c{seed}-{len(spent)}-{rng.random()}", buckets, cost)
            if isinstance(outcome, Denial):
                return
            await asyncio.sleep(rng.random() / 500)
            actual = cost if rng.random() < 0.7 else rng.randint(0, cost)
            await store.settle(outcome, actual)
            spent.append(actual)

    await asyncio.gather(*(caller(i) for i in range(50)))
    assert limit <= sum(spent) < limit + max_cost
