"""Accuracy and cost of the rate limiter, measured in one run.

(a) RPM across replicas: 4 limiter instances ("gateway replicas", one Redis
    connection pool each) hammer one user's limit of N requests per window.
    Prints the most admissions seen in any sliding window (Redis timestamps)
    over N; the reference is 4 per-replica in-process counters, the failure
    mode of limits that multiply with replicas.
(b) One token quota, 50 concurrent callers, every request using all it
    reserved (the worst case). Prints tokens spent over the quota and the
    overspend in tokens and in requests' worth; the reference checks and
    debits in two steps, the failure mode of budgets overspent under load.
(c) Per-admission latency of each backend (5 buckets per request).
(d) The whole request path: 4 gateway apps (auth, scripted head, admission,
    ledger; in-process ASGI, one database, one Redis pool each) take a burst of
    12 x N chat requests for one user with RPM N. Prints admitted/limit.

    .venv/bin/python bench/limits_bench.py --window-s 5 --limit 50
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import redis as sync_redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serve_app.limits.buckets import BucketSpec, CounterStore, Denial, Ticket
from serve_app.limits.memory import InProcessCounterStore
from serve_app.limits.redis_store import RedisCounterStore
from tests.fixtures.gateway import build_harness, chat_burst, start_heads

REPLICAS = 4


def busiest_window(stamps_ms: Sequence[int], window_ms: int) -> int:
    ordered = sorted(stamps_ms)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - window_ms:
            start += 1
        best = max(best, end - start + 1)
    return best


async def rpm_run(stores: Sequence[CounterStore], limit: int, window_s: float, windows: int) -> int:
    bucket = BucketSpec("requests", f"{{u:{uuid.uuid4().hex}}}:rpm:user", limit, "user")
    stamps: list[int] = []
    deadline = time.monotonic() + windows * window_s

    async def caller(store: CounterStore, name: str) -> None:
        i = 0
        while time.monotonic() < deadline:
            i += 1
            outcome = await store.admit(f"{name}-{i}", [bucket], 0)
            if isinstance(outcome, Ticket):
                stamps.append(outcome.admitted_at_ms)
            await asyncio.sleep(random.random() / 200)

    callers = [caller(s, f"{r}-{c}") for r, s in enumerate(stores) for c in range(16)]
    await asyncio.gather(*callers)
    return busiest_window(stamps, int(window_s * 1000))


async def quota_run(stores: Sequence[CounterStore], limit: int, max_cost: int) -> int:
    user = uuid.uuid4().hex
    buckets = [
        BucketSpec("tokens", f"{{u:{user}}}:tpm:user", limit, "user"),
        BucketSpec("daily", f"{{u:{user}}}:day", limit, "user"),
    ]
    spent: list[int] = []

    async def caller(n: int) -> None:
        rng, store, i = random.Random(n), stores[n % len(stores)], 0
        while True:
            i += 1
            cost = rng.randint(max_cost // 10, max_cost)
            outcome = await store.admit(f"{user}-{n}-{i}", buckets, cost)
            if isinstance(outcome, Denial):
                return
            await asyncio.sleep(rng.random() / 200)
            await store.settle(outcome, cost)
            spent.append(cost)

    await asyncio.gather(*(caller(n) for n in range(50)))
    return sum(spent)


async def naive_quota_run(limit: int, max_cost: int) -> int:
    """Reference: read the balance, then debit it later (two steps)."""
    used = 0

    async def caller(n: int) -> None:
        nonlocal used
        rng = random.Random(n)
        while used < limit:
            cost = rng.randint(max_cost // 10, max_cost)
            await asyncio.sleep(0)  # the round trip between "check" and "debit"
            used += cost
            await asyncio.sleep(rng.random() / 200)

    await asyncio.gather(*(caller(n) for n in range(50)))
    return used


async def latency(store: CounterStore, samples: int) -> tuple[float, float]:
    user = uuid.uuid4().hex
    tag = f"{{u:{user}}}"
    buckets = [
        BucketSpec("requests", f"{tag}:rpm:key:k", 10**9, "key"),
        BucketSpec("requests", f"{tag}:rpm:user", 10**9, "user"),
        BucketSpec("tokens", f"{tag}:tpm:key:k", 10**12, "key"),
        BucketSpec("tokens", f"{tag}:tpm:user", 10**12, "user"),
        BucketSpec("daily", f"{tag}:day", 10**12, "user"),
    ]
    times = []
    for i in range(samples):
        start = time.perf_counter()
        ticket = await store.admit(f"{user}-{i}", buckets, 100)
        times.append(time.perf_counter() - start)
        assert isinstance(ticket, Ticket)
        await store.settle(ticket, 50)
    times.sort()
    return statistics.median(times) * 1e6, times[int(len(times) * 0.99)] * 1e6


async def ping_latency(url: str, samples: int) -> tuple[float, float]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        await client.ping()
        times.append(time.perf_counter() - start)
    await client.aclose()
    times.sort()
    return statistics.median(times) * 1e6, times[int(len(times) * 0.99)] * 1e6


async def apps_run(url: str, prefix: str, limit: int) -> int:
    """Chat requests that got a 200 out of a burst of 12 x ``limit`` over four apps."""
    with tempfile.TemporaryDirectory() as folder:
        apps = [
            build_harness(
                Path(folder) / "gw.db",
                counters=RedisCounterStore.from_url(url, prefix=prefix),
            )
            for _ in range(REPLICAS)
        ]
        try:
            for app in apps:
                await start_heads(app)
            key = apps[0].store.create_key("bench-user", "bench-org")
            apps[0].store.update_user("bench-user", rpm=limit)
            codes = await chat_burst(apps, key, 12 * limit)
        finally:
            for app in apps:
                await app.aclose()
    return sum(1 for code in codes if code == 200)


def cleanup(url: str, prefix: str) -> None:
    client = sync_redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


StoreMaker = Callable[[int], list[CounterStore]]


async def main(args: argparse.Namespace) -> None:
    prefix = f"gwbench-{uuid.uuid4().hex[:8]}"
    created: list[CounterStore] = []

    def redis_stores(n: int) -> list[CounterStore]:
        """n independent stores, one connection pool each (one per replica)."""
        stores: list[CounterStore] = [
            RedisCounterStore.from_url(args.redis_url, prefix=prefix, window_s=args.window_s)
            for _ in range(n)
        ]
        created.extend(stores)
        return stores

    try:
        await report(args, redis_stores)
        admitted = await apps_run(args.redis_url, prefix, args.limit)
        print(
            f"(d) {REPLICAS} gateway apps, RPM {args.limit}, burst of {12 * args.limit} chat "
            f"requests: admitted {admitted}  admitted/limit {admitted / args.limit:.3f}"
        )
    finally:
        for store in created:
            await store.aclose()
        cleanup(args.redis_url, prefix)


async def report(args: argparse.Namespace, make: StoreMaker) -> None:
    limit, window = args.limit, args.window_s
    print(
        f"(a) RPM limit {limit} per {window:g} s window, {REPLICAS} replicas x 16 callers, "
        f"{args.windows} windows"
    )
    stores = make(REPLICAS)
    busiest = await rpm_run(stores, limit, window, args.windows)
    print(
        f"    redis, shared counters      busiest window {busiest:4d}  admitted/limit "
        f"{busiest / limit:.3f}"
    )
    local = [InProcessCounterStore(window_s=window) for _ in range(REPLICAS)]
    busiest = await rpm_run(local, limit, window, args.windows)
    print(
        f"    reference: per-replica      busiest window {busiest:4d}  admitted/limit "
        f"{busiest / limit:.3f}"
    )

    quota, max_cost = args.quota, args.max_cost
    print(
        f"(b) token quota {quota}, 50 concurrent callers, requests of "
        f"{max_cost // 10}..{max_cost} tokens, each using all it reserved"
    )
    runs: list[tuple[str, list[CounterStore]]] = [
        ("in-process", [InProcessCounterStore(window_s=window)]),
        ("redis, 4 replicas", make(REPLICAS)),
    ]
    for name, quota_stores in runs:
        spent = await quota_run(quota_stores, quota, max_cost)
        over = spent - quota
        print(
            f"    {name:<27} spent {spent:7d}  spent/quota {spent / quota:.4f}  overspend "
            f"{over:5d} tokens = {over / max_cost:.2f} x max request"
        )
    spent = await naive_quota_run(quota, max_cost)
    print(
        f"    {'reference: check then debit':<27} spent {spent:7d}  spent/quota "
        f"{spent / quota:.4f}  overspend {spent - quota:5d} tokens = "
        f"{(spent - quota) / max_cost:.2f} x max request"
    )

    print(f"(c) admission latency, 5 buckets, {args.samples} sequential admissions")
    backends: list[tuple[str, CounterStore]] = [
        ("in-process", InProcessCounterStore()),
        ("redis", make(1)[0]),
    ]
    for name, store in backends:
        p50, p99 = await latency(store, args.samples)
        print(f"    {name:<11} p50 {p50:8.1f} us   p99 {p99:8.1f} us")
    p50, p99 = await ping_latency(args.redis_url, args.samples)
    print(f"    {'redis PING':<11} p50 {p50:8.1f} us   p99 {p99:8.1f} us   (reference round trip)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--window-s", type=float, default=60.0, help="RPM window (spec: 60)")
    parser.add_argument("--windows", type=int, default=3, help="windows of load in (a)")
    parser.add_argument("--limit", type=int, default=50, help="requests per window in (a)")
    parser.add_argument("--quota", type=int, default=20_000, help="token quota in (b)")
    parser.add_argument("--max-cost", type=int, default=400, help="largest request in (b)")
    parser.add_argument("--samples", type=int, default=2000, help="admissions timed in (c)")
    asyncio.run(main(parser.parse_args()))
