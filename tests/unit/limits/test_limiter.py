"""Which limits apply to whom, and the 429s (docs/reference/common.md) the limiter raises."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from serve_app.auth.principal import Principal, UserLimits
from serve_app.limits.buckets import DAY_MS, BucketSpec, Denial, Ticket
from serve_app.limits.limiter import PlatformLimits, RateLimiter, plan_buckets
from serve_app.protocol.errors import ModelUnavailableError, RateLimitError
from tests.fixtures.limits import ManualClock, StoreFactory


def principal(
    *,
    key_rpm: int | None = None,
    key_tpm: int | None = None,
    user: UserLimits | None = None,
    key_id: str = "key_1",
) -> Principal:
    return Principal(
        key_id=key_id,
        user_id="usr_1",
        org_id="org_1",
        role="member",
        scopes=frozenset({"inference"}),
        user_limits=user or UserLimits(),
        key_rpm=key_rpm,
        key_tpm=key_tpm,
    )


def limits_of(buckets: list[BucketSpec]) -> dict[tuple[str, str], int]:
    return {(b.kind, b.scope): b.limit for b in buckets}


def test_nothing_set_means_no_buckets() -> None:
    assert plan_buckets(principal(), PlatformLimits()) == []


def test_key_and_user_limits_both_apply() -> None:
    who = principal(key_rpm=5, key_tpm=500, user=UserLimits(rpm=50, tpm=5000))
    assert limits_of(plan_buckets(who, PlatformLimits(rpm=1, tpm=1))) == {
        ("requests", "key"): 5,
        ("requests", "user"): 50,
        ("tokens", "key"): 500,
        ("tokens", "user"): 5000,
    }


def test_platform_defaults_stand_in_for_unset_user_values() -> None:
    platform = PlatformLimits(rpm=10, tpm=1000, daily_tokens=10_000)
    who = principal(key_rpm=3, user=UserLimits(tpm=7000))
    assert limits_of(plan_buckets(who, platform)) == {
        ("requests", "key"): 3,
        ("requests", "user"): 10,
        ("tokens", "user"): 7000,
        ("daily", "user"): 10_000,
    }


def test_counters_are_per_key_and_per_user() -> None:
    one = plan_buckets(principal(key_rpm=1, user=UserLimits(rpm=9)), PlatformLimits())
    other = plan_buckets(
        principal(key_rpm=1, user=UserLimits(rpm=9), key_id="key_2"), PlatformLimits()
    )
    assert one[0].key != other[0].key  # key buckets differ
    assert one[1].key == other[1].key  # one user bucket
    assert all(b.key.startswith("{u:usr_1}") for b in one)  # one Redis slot per user


async def test_rpm_429_carries_the_real_wait(make_store: StoreFactory, clock: ManualClock) -> None:
    limiter = RateLimiter(make_store(), PlatformLimits())
    who = principal(user=UserLimits(rpm=2))
    assert await limiter.admit(who, "a", 10) is not None
    clock.advance(15)
    assert await limiter.admit(who, "b", 10) is not None
    clock.advance(2.5)
    with pytest.raises(RateLimitError) as caught:
        await limiter.admit(who, "c", 10)
    err = caught.value
    assert (err.status_code, err.error_type, err.code) == (
        429,
        "rate_limit_error",
        "rate_limit_exceeded",
    )
    assert err.headers["Retry-After"] == "43"  # 60 - 17.5 = 42.5, rounded up


async def test_daily_quota_429_is_insufficient_quota_until_midnight(
    make_store: StoreFactory,
) -> None:
    midnight = (round(ManualClock().now * 1000) // DAY_MS + 1) * DAY_MS / 1000
    clock = ManualClock(midnight - 3600)
    limiter = RateLimiter(make_store(clock=clock), PlatformLimits(daily_tokens=100))
    who = principal()
    ticket = await limiter.admit(who, "a", 150)
    await limiter.settle(ticket, 120)
    with pytest.raises(RateLimitError) as caught:
        await limiter.admit(who, "b", 1)
    assert caught.value.code == "insufficient_quota"
    assert caught.value.headers["Retry-After"] == "3600"


class BrokenStore:
    """A counter store whose backend is down."""

    def __init__(self) -> None:
        self.calls = 0

    async def admit(
        self, member: str, buckets: Sequence[BucketSpec], cost: int, *, seed_daily: bool = False
    ) -> Ticket | Denial:
        self.calls += 1
        raise ConnectionError("redis down")

    async def seed_daily(self, bucket: BucketSpec, day: int, used: int) -> None:
        raise ConnectionError("redis down")

    async def settle(self, ticket: Ticket, used: int) -> None:
        raise ConnectionError("redis down")

    async def aclose(self) -> None:
        return None


async def test_unlimited_callers_never_reach_the_store() -> None:
    store = BrokenStore()
    limiter = RateLimiter(store, PlatformLimits(), fail_open=False)
    assert await limiter.admit(principal(), "a", 10) is None
    assert store.calls == 0


async def test_store_outage_fails_open_or_closed_as_configured() -> None:
    who = principal(key_rpm=1)
    store = BrokenStore()
    assert await RateLimiter(store, PlatformLimits()).admit(who, "a", 1) is None
    with pytest.raises(ModelUnavailableError):
        await RateLimiter(store, PlatformLimits(), fail_open=False).admit(who, "b", 1)
    assert store.calls == 2
