"""The in-process counter backend: the single-process default (no Redis needed).

It keeps the same sliding-window logs as the Redis backend, in memory. The
critical section never awaits, so a plain ``threading.Lock`` makes check and
reserve one atomic step both for the tasks of one event loop and for callers on
other threads (an ``asyncio.Lock`` would only cover one loop). Counters are not
shared between processes: with several gateway replicas, configure Redis.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

from serve_app.limits.buckets import (
    BucketSpec,
    BucketState,
    Clock,
    Denial,
    SeedNeeded,
    Ticket,
    ms_to_midnight,
    pick_denial,
    utc_day,
)


class _Entry:
    __slots__ = ("member", "ts", "weight")

    def __init__(self, ts: int, member: str, weight: int) -> None:
        self.ts = ts
        self.member = member
        self.weight = weight


class _WindowLog:
    """Entries of one bucket in admission order, with their running total."""

    def __init__(self) -> None:
        self.entries: deque[_Entry] = deque()
        self.by_member: dict[str, _Entry] = {}
        self.total = 0

    def purge(self, cutoff_ms: int) -> None:
        """Drop entries that left the window (``ts <= now - window``)."""
        while self.entries and self.entries[0].ts <= cutoff_ms:
            entry = self.entries.popleft()
            self.by_member.pop(entry.member, None)
            self.total -= entry.weight

    def wait_ms(self, limit: int, now_ms: int, window_ms: int) -> int | None:
        """None when below the limit; else when the oldest entries free enough room."""
        if self.total < limit:
            return None
        remaining = self.total
        for entry in self.entries:
            remaining -= entry.weight
            if remaining < limit:
                return entry.ts + window_ms - now_ms
        return window_ms  # unreachable with limit >= 1; a safe answer anyway

    def add(self, ts: int, member: str, weight: int) -> None:
        entry = _Entry(ts, member, weight)
        self.entries.append(entry)
        self.by_member[member] = entry
        self.total += weight

    def settle(self, member: str, weight: int) -> None:
        entry = self.by_member.get(member)
        if entry is not None:  # gone already when the request outlived the window
            self.total += weight - entry.weight
            entry.weight = weight


class InProcessCounterStore:
    """``CounterStore`` for one process; ``window_s`` is the RPM/TPM window."""

    def __init__(self, *, window_s: float = 60.0, clock: Clock = time.time) -> None:
        self._window_ms = int(window_s * 1000)
        self._clock = clock
        self._lock = threading.Lock()
        self._logs: dict[str, _WindowLog] = {}
        self._days: dict[str, tuple[int, int]] = {}  # key -> (utc day, tokens used)

    def _now_ms(self) -> int:
        return round(self._clock() * 1000)

    def _log(self, key: str, now_ms: int) -> _WindowLog:
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = _WindowLog()
        log.purge(now_ms - self._window_ms)
        return log

    def _day_used(self, key: str, day: int) -> int:
        stored = self._days.get(key)
        return stored[1] if stored is not None and stored[0] == day else 0

    def _check(self, bucket: BucketSpec, now_ms: int) -> Denial | None:
        if bucket.kind == "daily":
            if self._day_used(bucket.key, utc_day(now_ms)) < bucket.limit:
                return None
            return Denial(bucket, ms_to_midnight(now_ms))
        wait = self._log(bucket.key, now_ms).wait_ms(bucket.limit, now_ms, self._window_ms)
        return None if wait is None else Denial(bucket, wait)

    def _state(self, bucket: BucketSpec, now_ms: int) -> BucketState:
        if bucket.kind == "daily":
            used = self._day_used(bucket.key, utc_day(now_ms))
            return BucketState(bucket, used, ms_to_midnight(now_ms) if used else 0)
        log = self._logs.get(bucket.key)
        if log is None or not log.entries:
            return BucketState(bucket, 0, 0)
        return BucketState(bucket, log.total, log.entries[-1].ts + self._window_ms - now_ms)

    async def admit(
        self, member: str, buckets: Sequence[BucketSpec], cost: int, *, seed_daily: bool = False
    ) -> Ticket | Denial | SeedNeeded:
        with self._lock:
            now_ms = self._now_ms()
            if seed_daily:
                day = utc_day(now_ms)
                for bucket in buckets:
                    stored = self._days.get(bucket.key)
                    if bucket.kind == "daily" and (stored is None or stored[0] != day):
                        return SeedNeeded(bucket, day)
            denials = [d for b in buckets if (d := self._check(b, now_ms)) is not None]
            denial = pick_denial(denials)
            if denial is not None:
                return replace(denial, states=tuple(self._state(b, now_ms) for b in buckets))
            day = utc_day(now_ms)
            for bucket in buckets:
                if bucket.kind == "daily":
                    self._days[bucket.key] = (day, self._day_used(bucket.key, day) + cost)
                else:
                    weight = 1 if bucket.kind == "requests" else cost
                    self._logs[bucket.key].add(now_ms, member, weight)
            states = tuple(self._state(b, now_ms) for b in buckets)
            return Ticket(member, cost, tuple(buckets), day, now_ms, states)

    async def seed_daily(self, bucket: BucketSpec, day: int, used: int) -> None:
        with self._lock:
            stored = self._days.get(bucket.key)
            if stored is None or stored[0] != day:
                self._days[bucket.key] = (day, used)

    async def settle(self, ticket: Ticket, used: int) -> None:
        with self._lock:
            for bucket in ticket.settled_buckets():
                if bucket.kind == "daily":
                    stored = self._days.get(bucket.key)
                    if stored is not None and stored[0] == ticket.day:
                        self._days[bucket.key] = (ticket.day, stored[1] + used - ticket.cost)
                else:
                    log = self._logs.get(bucket.key)
                    if log is not None:
                        log.settle(ticket.member, used)
            self._forget_idle(ticket)

    def _forget_idle(self, ticket: Ticket) -> None:
        """Drop this ticket's logs once empty, so idle callers cost no memory."""
        cutoff = self._now_ms() - self._window_ms
        for bucket in ticket.buckets:
            log = self._logs.get(bucket.key)
            if log is not None:
                log.purge(cutoff)
                if not log.entries:
                    del self._logs[bucket.key]

    async def aclose(self) -> None:
        return None
