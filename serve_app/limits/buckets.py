"""The vocabulary shared by every counter backend: buckets, tickets, denials.

A request is admitted against several buckets at once (key RPM, user RPM, key
TPM, user TPM, the user's daily quota). Backends receive the whole list and
must check and reserve all of them in one atomic step: checking one bucket,
then debiting another, is exactly how limits get overspent under concurrency.

Rules every backend implements identically (the tests run the same cases on
each):

- ``requests`` and ``tokens`` buckets are sliding-window logs: an entry counts
  while ``now < admitted_at + window``, so the limit holds in *every* window of
  that length, not only in aligned ones (a fixed window lets 2N through around
  a boundary).
- A bucket admits while its total (including in-flight reservations) is below
  its limit; the request then adds its weight (1, or its token reservation).
  For requests that is exactly "at most N per window". For tokens it bounds the
  overspend by one request: every admission happens below the limit and adds at
  most one request's reservation, and settling only lowers it.
- ``daily`` buckets are counters per UTC day; they reset at midnight UTC.
- A denial carries the real wait: the time until enough of the oldest entries
  leave the window for the total to drop below the limit (midnight for daily).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

BucketKind = Literal["requests", "tokens", "daily"]
Scope = Literal["key", "user"]
Clock = Callable[[], float]
"""Seconds since the epoch (``time.time``); tests inject a manual clock."""

DAY_MS = 86_400_000


@dataclass(frozen=True)
class BucketSpec:
    """One limit to enforce; ``key`` names the counter (shared by all replicas)."""

    kind: BucketKind
    key: str
    limit: int
    scope: Scope


@dataclass(frozen=True)
class BucketState:
    """A bucket right after an admission decision: what the ``x-ratelimit-*`` headers say.

    ``used`` counts this request when it was admitted (its token reservation, not
    yet its real usage); ``reset_ms`` is the wait until the bucket is back to its
    full limit (every entry left the window; midnight UTC for the daily quota).
    """

    bucket: BucketSpec
    used: int
    reset_ms: int

    @property
    def remaining(self) -> int:
        return max(0, self.bucket.limit - self.used)


@dataclass(frozen=True)
class Ticket:
    """An admission: what was reserved where, so the reservation can be settled."""

    member: str
    cost: int
    buckets: tuple[BucketSpec, ...]
    day: int
    admitted_at_ms: int
    states: tuple[BucketState, ...] = ()

    def settled_buckets(self) -> tuple[BucketSpec, ...]:
        """Buckets whose reservation depends on the real usage (not request counts)."""
        return tuple(b for b in self.buckets if b.kind != "requests")


@dataclass(frozen=True)
class Denial:
    """Why a request was refused and how long until it can pass."""

    bucket: BucketSpec
    retry_after_ms: int
    states: tuple[BucketState, ...] = ()

    @property
    def retry_after_s(self) -> int:
        """Whole seconds, rounded up: waiting that long is always enough."""
        return max(1, math.ceil(self.retry_after_ms / 1000))


@dataclass(frozen=True)
class SeedNeeded:
    """The daily counter of ``bucket`` for ``day`` does not exist (a new day, or the
    counter was lost: Redis flushed or restarted, the process restarted). Nothing was
    reserved; the limiter seeds it from the ledger and admits again."""

    bucket: BucketSpec
    day: int


class CounterStore(Protocol):
    """Atomic admission against many buckets; settlement of token reservations."""

    async def admit(
        self, member: str, buckets: Sequence[BucketSpec], cost: int, *, seed_daily: bool = False
    ) -> Ticket | Denial | SeedNeeded:
        """Reserve ``cost`` tokens (and one request) in every bucket, or none of them.

        ``seed_daily``: report a missing daily counter (``SeedNeeded``) instead of
        counting it from zero."""
        ...

    async def seed_daily(self, bucket: BucketSpec, day: int, used: int) -> None:
        """Create the daily counter at ``used`` unless it exists by now."""
        ...

    async def settle(self, ticket: Ticket, used: int) -> None:
        """Replace the ticket's token reservation with the real usage; call once."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


def utc_day(now_ms: int) -> int:
    """Days since the epoch in UTC: the daily quota's counter name."""
    return now_ms // DAY_MS


def ms_to_midnight(now_ms: int) -> int:
    return (utc_day(now_ms) + 1) * DAY_MS - now_ms


def pick_denial(denials: Sequence[Denial]) -> Denial | None:
    """The denial to report: the daily quota first (a minute's wait cannot help),
    otherwise the longest wait, since every bucket must have room again."""
    if not denials:
        return None
    daily = [d for d in denials if d.bucket.kind == "daily"]
    if daily:
        return daily[0]
    return max(denials, key=lambda d: d.retry_after_ms)
