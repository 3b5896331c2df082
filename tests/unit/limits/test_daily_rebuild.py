"""A lost daily quota counter is rebuilt from the SQL ledger, not restarted at zero (issue 16).

Runs on both counter backends; "lost" is a restarted process (memory) or a Redis
that lost its keys (flushed, restarted without persistence).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from serve_app.auth.principal import UserLimits
from serve_app.limits.buckets import DAY_MS
from serve_app.limits.limiter import PlatformLimits, RateLimiter
from serve_app.protocol.errors import RateLimitError
from tests.fixtures.limits import ManualClock, StoreFactory
from tests.unit.limits.test_limiter import principal


def _lose_counters(make_store: StoreFactory, request: pytest.FixtureRequest) -> Any:
    """A store as it is after the counters were lost."""
    if make_store.backend == "redis":  # type: ignore[attr-defined]
        prefix = request.getfixturevalue("redis_prefix")
        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        assert keys  # the day's counter was there
        client.delete(*keys)
        client.close()
    return make_store()


async def test_a_lost_daily_counter_is_rebuilt_from_the_ledger(
    make_store: StoreFactory, clock: ManualClock, request: pytest.FixtureRequest
) -> None:
    ledger = {"usr_1": 80}  # tokens the ledger billed today, before the counter existed
    asked: list[tuple[str, datetime, datetime]] = []

    def billed_today(user: str, start: datetime, end: datetime) -> int:
        asked.append((user, start, end))
        return ledger[user]

    who = principal(user=UserLimits(daily_tokens=100))
    limiter = RateLimiter(make_store(), PlatformLimits(), daily_usage=billed_today)
    # 80 billed + 10: still below 100; + 10 more reaches it; the third is refused.
    await limiter.settle(await limiter.admit(who, "a", 10), 10)
    await limiter.settle(await limiter.admit(who, "b", 10), 10)
    with pytest.raises(RateLimitError) as refused:
        await limiter.admit(who, "c", 10)
    assert refused.value.code == "insufficient_quota"
    day_start = datetime.fromtimestamp(clock.now // 86_400 * DAY_MS / 1000, UTC)
    assert [(u, s) for u, s, _ in asked] == [("usr_1", day_start)]  # read once, then counted

    # The counters are lost; the ledger meanwhile holds the day's 100 tokens.
    ledger["usr_1"] = 100
    limiter.store = _lose_counters(make_store, request)
    with pytest.raises(RateLimitError):
        await limiter.admit(who, "d", 1)
    assert len(asked) == 2


async def test_without_a_ledger_the_counter_alone_decides(make_store: StoreFactory) -> None:
    limiter = RateLimiter(make_store(), PlatformLimits(daily_tokens=15))
    who = principal()
    await limiter.admit(who, "a", 10)
    await limiter.admit(who, "b", 10)
    with pytest.raises(RateLimitError):
        await limiter.admit(who, "c", 1)
