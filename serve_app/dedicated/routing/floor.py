"""Calls in flight on a hybrid endpoint's reserved floor, counted across gateway replicas.

A hybrid endpoint sends a call to its reserved floor (``head``) while the floor
has room (``reserved_floor x target_inputs`` calls in flight) and to the spot
burst otherwise. With several gateway replicas each counting only its own
calls, every replica believed the floor had room: N replicas put up to N times
the floor's share on it and left the burst idle. The count is shared instead:

- ``RedisFloorCounts`` (``GATEWAY_REDIS_URL``): one sorted set per endpoint and
  deployment, member = call id, score = when the entry lapses. Choosing and
  counting is one Lua script, so two replicas cannot both take the last slot.
  An entry lapses after ``ttl_s`` (a replica that died mid-call cannot hold a
  slot forever); a call that outlives it simply stops counting.
- ``LocalFloorCounts``: the same in one process (the single-process default).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Any, Protocol

logger = logging.getLogger(__name__)

DEFAULT_TTL_S = 900.0

CHOOSE_LUA = r"""
local now, ttl, cap, call = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local busy = redis.call('ZCARD', KEYS[1])
local chosen = 2
if busy < cap then chosen = 1 end
redis.call('ZADD', KEYS[chosen], now + ttl, call)
redis.call('PEXPIRE', KEYS[chosen], ttl + 1000)
return chosen
"""


class FloorCounts(Protocol):
    async def choose(self, app: str, head: str, burst: str, cap: int, call_id: str) -> str:
        """``head`` while fewer than ``cap`` calls are in flight on it, else ``burst``;
        the call is counted on the one chosen until ``release``."""
        ...

    async def release(self, app: str, deployment: str, call_id: str) -> None: ...

    async def aclose(self) -> None: ...


class LocalFloorCounts:
    """In-process counts: correct for one gateway process only."""

    def __init__(self) -> None:
        self._calls: defaultdict[tuple[str, str], set[str]] = defaultdict(set)

    async def choose(self, app: str, head: str, burst: str, cap: int, call_id: str) -> str:
        chosen = head if len(self._calls[(app, head)]) < cap else burst
        self._calls[(app, chosen)].add(call_id)
        return chosen

    async def release(self, app: str, deployment: str, call_id: str) -> None:
        self._calls[(app, deployment)].discard(call_id)

    async def aclose(self) -> None:
        return None


class RedisFloorCounts:
    """Counts every gateway replica shares (see the module docstring)."""

    def __init__(self, redis: Any, *, prefix: str = "gw", ttl_s: float = DEFAULT_TTL_S) -> None:
        self._redis = redis
        self._prefix = prefix
        self._ttl_ms = int(ttl_s * 1000)
        self._choose = redis.register_script(CHOOSE_LUA)
        self._local = LocalFloorCounts()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisFloorCounts:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        return cls(client, **kwargs)

    def _key(self, app: str, deployment: str) -> str:
        return f"{self._prefix}:ded-floor:{app}:{deployment}"

    async def choose(self, app: str, head: str, burst: str, cap: int, call_id: str) -> str:
        keys = [self._key(app, head), self._key(app, burst)]
        now = int(time.time() * 1000)
        try:
            chosen = await self._choose(keys=keys, args=[now, self._ttl_ms, cap, call_id])
        except Exception:
            # Redis down: route on this replica's own count rather than fail the call.
            logger.warning("floor counts unavailable; routing on local counts", exc_info=True)
            return await self._local.choose(app, head, burst, cap, call_id)
        return head if int(chosen) == 1 else burst

    async def release(self, app: str, deployment: str, call_id: str) -> None:
        await self._local.release(app, deployment, call_id)
        try:
            await asyncio.shield(self._redis.zrem(self._key(app, deployment), call_id))
        except Exception:
            logger.warning("could not release a floor slot (it lapses on its own)", exc_info=True)

    async def aclose(self) -> None:
        await self._redis.aclose()


def build_floor_counts(redis_url: str | None, prefix: str = "gw") -> FloorCounts:
    """Redis when configured (shared by replicas), else in-process."""
    return RedisFloorCounts.from_url(redis_url, prefix=prefix) if redis_url else LocalFloorCounts()
