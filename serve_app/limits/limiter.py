"""Which limits apply to a caller, and the 429s that enforce them (docs/reference/common.md).

Resolution: a key's own RPM/TPM apply when set; the user's RPM/TPM apply when
set, else the platform defaults take the user's place; both levels may apply to
one request. The daily token quota is per user (its own value, else the
platform default). A caller with nothing set and no platform defaults never
touches the counter store at all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from serve_app.auth.principal import Principal
from serve_app.billing.batch_line import current_batch_line
from serve_app.limits.buckets import (
    DAY_MS,
    BucketKind,
    BucketSpec,
    CounterStore,
    Denial,
    Scope,
    SeedNeeded,
    Ticket,
)
from serve_app.limits.headers import rate_limit_headers, record_states
from serve_app.protocol.errors import ModelUnavailableError, RateLimitError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlatformLimits:
    """Defaults for users without their own values; ``None`` means unlimited."""

    rpm: int | None = None
    tpm: int | None = None
    daily_tokens: int | None = None
    window_s: float = 60.0


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def plan_buckets(principal: Principal, platform: PlatformLimits) -> list[BucketSpec]:
    """The buckets one request of ``principal`` is admitted against."""
    tag = f"{{u:{principal.user_id}}}"  # Redis hash tag: one slot per user
    key = principal.key_id
    user = principal.user_limits
    wanted: list[tuple[BucketKind, Scope, int | None, str]] = [
        ("requests", "key", principal.key_rpm, f"{tag}:rpm:key:{key}"),
        ("requests", "user", _first(user.rpm, platform.rpm), f"{tag}:rpm:user"),
        ("tokens", "key", principal.key_tpm, f"{tag}:tpm:key:{key}"),
        ("tokens", "user", _first(user.tpm, platform.tpm), f"{tag}:tpm:user"),
        ("daily", "user", _first(user.daily_tokens, platform.daily_tokens), f"{tag}:day"),
    ]
    return [
        BucketSpec(kind, name, limit, scope)
        for kind, scope, limit, name in wanted
        if limit is not None
    ]


def rate_limit_error(denial: Denial, window_s: float) -> RateLimitError:
    """The API's 429: ``insufficient_quota`` for the day, else ``rate_limit_exceeded``."""
    bucket, wait = denial.bucket, denial.retry_after_s
    headers = {**rate_limit_headers(denial.states), "Retry-After": str(wait)}
    if bucket.kind == "daily":
        return RateLimitError(
            f"The daily token quota of {bucket.limit} tokens for this user is used up; "
            f"it resets at midnight UTC (in {wait} s).",
            code="insufficient_quota",
            headers=headers,
        )
    unit = "requests" if bucket.kind == "requests" else "tokens"
    per = "minute" if window_s == 60 else f"{window_s:g} s"
    owner = "API key" if bucket.scope == "key" else "user"
    return RateLimitError(
        f"Rate limit reached: {bucket.limit} {unit} per {per} for this {owner}. "
        f"Retry after {wait} s.",
        headers=headers,
    )


DailyUsage = Callable[[str, datetime, datetime], int]
"""Tokens a user was billed in [start, end) according to the ledger (the SQL source of truth)."""


class RateLimiter:
    """Admits requests before any byte is sent and settles them afterwards.

    ``daily_usage`` (the ledger) rebuilds a daily quota counter that does not exist:
    Redis lost it (flushed, restarted without persistence) or this process restarted.
    Without it a lost counter would start the day over at zero.
    """

    def __init__(
        self,
        store: CounterStore,
        platform: PlatformLimits,
        *,
        fail_open: bool = True,
        daily_usage: DailyUsage | None = None,
        on_fail_open: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.platform = platform
        self.fail_open = fail_open
        self.daily_usage = daily_usage
        self.on_fail_open = on_fail_open
        """Called for each request let through unlimited (a metric, so it is not log-only)."""
        self._store_failing = False
        """An outage is logged when it starts and when it ends, not once per request (a
        traceback per refused request flooded the log during a Redis restart)."""

    async def _admit(
        self, principal: Principal, request_id: str, buckets: list[BucketSpec], cost: int
    ) -> Ticket | Denial:
        seed = self.daily_usage is not None
        outcome = await self.store.admit(request_id, buckets, cost, seed_daily=seed)
        if isinstance(outcome, SeedNeeded) and self.daily_usage is not None:
            start = datetime.fromtimestamp(outcome.day * DAY_MS / 1000, UTC)
            used = await asyncio.to_thread(
                self.daily_usage, principal.user_id, start, start + timedelta(days=1)
            )
            await self.store.seed_daily(outcome.bucket, outcome.day, used)
            outcome = await self.store.admit(request_id, buckets, cost)
        assert not isinstance(outcome, SeedNeeded)  # only reported when asked to
        return outcome

    async def admit(self, principal: Principal, request_id: str, cost: int) -> Ticket | None:
        """Reserve one request and ``cost`` tokens, or raise the 429.

        Returns None when no limit applies (nothing to settle). A store outage
        lets traffic through when ``fail_open`` (logged), else answers 503. A batch
        line is checked against the daily quota only: live RPM/TPM are not spent on
        batch work, which has its own limit (docs/api.md, "Batches").
        """
        buckets = plan_buckets(principal, self.platform)
        if current_batch_line() is not None:
            buckets = [b for b in buckets if b.kind == "daily"]
        if not buckets:
            return None
        try:
            outcome = await self._admit(principal, request_id, buckets, max(0, cost))
        except Exception:
            if not self._store_failing:
                self._store_failing = True
                logger.exception(
                    "counter store unavailable during admission; requests are %s until it "
                    "answers again",
                    "admitted without limits" if self.fail_open else "refused (503)",
                )
            if self.fail_open:
                if self.on_fail_open is not None:
                    self.on_fail_open()
                return None
            raise ModelUnavailableError(
                "Rate limiting is temporarily unavailable; retry shortly.",
                headers={"Retry-After": "1"},
            ) from None
        if self._store_failing:
            self._store_failing = False
            logger.warning("counter store answers again; limits apply")
        record_states(outcome.states)
        if isinstance(outcome, Denial):
            raise rate_limit_error(outcome, self.platform.window_s)
        return outcome

    async def settle(self, ticket: Ticket | None, used: int) -> None:
        """Replace the reservation with ``used`` tokens; never raises."""
        if ticket is None:
            return
        try:
            await self.store.settle(ticket, max(0, used))
        except Exception:
            logger.exception("could not settle reservation %s", ticket.member)

    async def aclose(self) -> None:
        await self.store.aclose()


def build_counter_store(
    redis_url: str | None, *, window_s: float, prefix: str = "gw"
) -> CounterStore:
    """Redis when a URL is configured (shared by replicas), else in-process."""
    if redis_url:
        from serve_app.limits.redis_store import RedisCounterStore

        return RedisCounterStore.from_url(redis_url, prefix=prefix, window_s=window_s)
    from serve_app.limits.memory import InProcessCounterStore

    return InProcessCounterStore(window_s=window_s)
