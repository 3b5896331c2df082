"""Answers kept for requests sent with an ``Idempotency-Key``, shared by gateway replicas.

A retry must not be generated (and billed) again: the first attempt that
completes keeps its answer here, and a retry with the same key gets that
answer back instead of a new generation (``serve_app.ingress.idempotency``).
One slot per (caller, route, key) goes through three states:

- absent: the next request with the key claims it (and runs);
- pending: an attempt runs; it holds a lease it renews while it runs, so a
  replica that dies mid-request frees the slot within one lease;
- answered: the stored answer, kept ``keep_s`` (24 h), replayed to retries.

Only the holder of the claim (its random ``token``) may complete or release
it, so a late writer whose lease ran out never overwrites another's answer.

Backends mirror the counter stores (``serve_app.limits``): Redis, with one
Lua script per transition, when ``GATEWAY_REDIS_URL`` is set (retries reach any
replica); in-process otherwise, bounded in memory.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
"""In-process store: answers kept at most, oldest dropped first (a dropped answer
only means a late retry runs again)."""


@dataclass(frozen=True)
class StoredAnswer:
    """An HTTP answer as first sent: status, headers (latin-1 text) and the whole body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True)
class Claimed:
    """The slot is this request's; ``token`` completes or releases it."""

    token: str


@dataclass(frozen=True)
class InFlight:
    """Another attempt with the key runs now."""

    fingerprint: str


@dataclass(frozen=True)
class Answered:
    """An attempt with the key completed; its answer is replayed."""

    fingerprint: str
    answer: StoredAnswer


ClaimOutcome = Claimed | InFlight | Answered


class ReplayStore(Protocol):
    """Claims, leases and stored answers of idempotency slots."""

    async def claim(self, slot: str, fingerprint: str, lease_s: float) -> ClaimOutcome: ...

    async def renew(self, slot: str, token: str, lease_s: float) -> None: ...

    async def complete(
        self, slot: str, token: str, answer: StoredAnswer, keep_s: float
    ) -> None: ...

    async def release(self, slot: str, token: str) -> None: ...

    async def aclose(self) -> None: ...


@dataclass
class _Slot:
    fingerprint: str
    expires_at: float
    token: str | None  # set while pending
    answer: StoredAnswer | None = None

    @property
    def size(self) -> int:
        return 0 if self.answer is None else len(self.answer.body) + 256


class InProcessReplayStore:
    """``ReplayStore`` of one process (the single-replica default)."""

    def __init__(
        self, *, max_bytes: int = DEFAULT_MAX_BYTES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        self._bytes = 0

    def _live(self, slot: str) -> _Slot | None:
        entry = self._slots.get(slot)
        if entry is not None and entry.expires_at <= self._clock():
            self._drop(slot)
            return None
        return entry

    def _drop(self, slot: str) -> None:
        entry = self._slots.pop(slot, None)
        if entry is not None:
            self._bytes -= entry.size

    async def claim(self, slot: str, fingerprint: str, lease_s: float) -> ClaimOutcome:
        with self._lock:
            entry = self._live(slot)
            if entry is None:
                token = secrets.token_hex(16)
                self._slots[slot] = _Slot(fingerprint, self._clock() + lease_s, token)
                return Claimed(token)
            if entry.answer is None:
                return InFlight(entry.fingerprint)
            return Answered(entry.fingerprint, entry.answer)

    async def renew(self, slot: str, token: str, lease_s: float) -> None:
        with self._lock:
            entry = self._live(slot)
            if entry is not None and entry.token == token:
                entry.expires_at = self._clock() + lease_s

    async def complete(self, slot: str, token: str, answer: StoredAnswer, keep_s: float) -> None:
        with self._lock:
            entry = self._live(slot)
            if entry is None or entry.token != token:
                return
            entry.token, entry.answer = None, answer
            entry.expires_at = self._clock() + keep_s
            self._bytes += entry.size
            self._slots.move_to_end(slot)
            self._trim()

    def _trim(self) -> None:
        """Drop expired answers, then the oldest ones while over the byte budget.

        Answers sit in completion order, which is expiry order (one ``keep_s``), so
        the walk stops at the first one still wanted; claims in flight are never
        dropped (that would let a retry run next to its original).
        """
        now = self._clock()
        for slot, entry in list(self._slots.items()):
            if entry.answer is None:
                continue
            if entry.expires_at > now and self._bytes <= self._max_bytes:
                break
            self._drop(slot)

    async def release(self, slot: str, token: str) -> None:
        with self._lock:
            entry = self._live(slot)
            if entry is not None and entry.token == token:
                self._drop(slot)

    async def aclose(self) -> None:
        return None


CLAIM_LUA = r"""
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  redis.call('HSET', KEYS[1], 'state', 'pending', 'fp', ARGV[1], 'token', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'claimed'}
end
-- Our own claim, sent again after the connection broke (shared_redis retries once):
-- still ours, or the request would wait a whole lease for itself.
if state == 'pending' and redis.call('HGET', KEYS[1], 'token') == ARGV[2] then
  return {'claimed'}
end
if state == 'pending' then return {'pending', redis.call('HGET', KEYS[1], 'fp')} end
return {'done', unpack(redis.call('HMGET', KEYS[1], 'fp', 'status', 'headers', 'body'))}
"""

RENEW_LUA = r"""
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
"""

COMPLETE_LUA = r"""
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'status', ARGV[2], 'headers', ARGV[3], 'body', ARGV[4])
redis.call('HDEL', KEYS[1], 'token')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"""

RELEASE_LUA = r"""
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisReplayStore:
    """``ReplayStore`` on Redis: a hash per slot, under ``<prefix>:idem:``."""

    def __init__(self, redis: Any, *, prefix: str = "gw") -> None:
        self._redis = redis
        self._prefix = prefix
        self._claim = redis.register_script(CLAIM_LUA)
        self._renew = redis.register_script(RENEW_LUA)
        self._complete = redis.register_script(COMPLETE_LUA)
        self._release = redis.register_script(RELEASE_LUA)

    @classmethod
    def from_url(cls, url: str, *, max_connections: int = 32, **kwargs: Any) -> RedisReplayStore:
        """A store on its own pool (binary replies: bodies are bytes), configured as the
        counters' is (``serve_app.limits.redis_store.shared_redis``)."""
        from serve_app.limits.redis_store import shared_redis

        return cls(shared_redis(url, max_connections=max_connections), **kwargs)

    def _key(self, slot: str) -> list[str]:
        return [f"{self._prefix}:idem:{slot}"]

    async def claim(self, slot: str, fingerprint: str, lease_s: float) -> ClaimOutcome:
        token = secrets.token_hex(16)
        lease_ms = max(1, round(lease_s * 1000))
        reply = await self._claim(keys=self._key(slot), args=[fingerprint, token, lease_ms])
        state = _text(reply[0])
        if state == "claimed":
            return Claimed(token)
        if state == "pending":
            return InFlight(_text(reply[1]))
        headers = [(str(k), str(v)) for k, v in json.loads(_text(reply[3]))]
        body = reply[4] if isinstance(reply[4], bytes) else str(reply[4]).encode()
        return Answered(_text(reply[1]), StoredAnswer(int(_text(reply[2])), headers, body))

    async def renew(self, slot: str, token: str, lease_s: float) -> None:
        await self._renew(keys=self._key(slot), args=[token, max(1, round(lease_s * 1000))])

    async def complete(self, slot: str, token: str, answer: StoredAnswer, keep_s: float) -> None:
        args: list[Any] = [
            token,
            answer.status,
            json.dumps(answer.headers),
            answer.body,
            max(1, round(keep_s * 1000)),
        ]
        await self._complete(keys=self._key(slot), args=args)

    async def release(self, slot: str, token: str) -> None:
        await self._release(keys=self._key(slot), args=[token])

    async def aclose(self) -> None:
        await self._redis.aclose()
        await self._redis.connection_pool.disconnect()


def build_replay_store(redis_url: str | None, *, prefix: str = "gw") -> ReplayStore:
    """Redis when a URL is configured (shared by replicas), else in-process."""
    if redis_url:
        return RedisReplayStore.from_url(redis_url, prefix=prefix)
    return InProcessReplayStore()
