"""The Redis counter backend: one set of counters for every gateway replica.

Admission is one Lua script call that purges, checks and reserves every bucket
of the request; Redis runs scripts atomically, so four replicas (or forty)
admit no more than the limit between them. The clock is Redis's own ``TIME``
unless a clock is injected (tests, benchmarks), so replicas on machines with
skewed clocks still agree on the window.

Keys (all under ``prefix``; ``{u:<user>}`` is a hash tag so that every key of
one admission lands on the same Redis Cluster slot):

- requests bucket: a sorted set, member = request id, score = admission ms.
- tokens bucket: a sorted set, member = ``<request id>|<tokens>``, plus a
  running total in ``<key>:s`` so a check costs O(expired entries), not O(log).
- daily bucket: a counter ``<key>:<utc day>`` expiring an hour after midnight.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from serve_app.limits.buckets import (
    DAY_MS,
    BucketSpec,
    BucketState,
    Clock,
    Denial,
    SeedNeeded,
    Ticket,
)

_COMMON = r"""
local function weight_of(m)
  return tonumber(string.match(m, '|(%d+)$'))
end
"""

ADMIT_LUA = (
    _COMMON
    + r"""
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local window, member, cost, n = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local seed = ARGV[6 + 2 * n] == '1'
local cutoff = now - window
local day = math.floor(now / 86400000)
local midnight = (day + 1) * 86400000

local function purge_tokens(z, s)
  local old = redis.call('ZRANGEBYSCORE', z, '-inf', cutoff)
  if #old > 0 then
    local drop = 0
    for _, m in ipairs(old) do drop = drop + weight_of(m) end
    redis.call('ZREMRANGEBYSCORE', z, '-inf', cutoff)
    if redis.call('ZCARD', z) == 0 then redis.call('DEL', s) else redis.call('DECRBY', s, drop) end
  end
  return tonumber(redis.call('GET', s) or '0')
end

local function tokens_wait(z, total, limit)
  local remaining, start = total, 0
  while true do
    local batch = redis.call('ZRANGE', z, start, start + 99, 'WITHSCORES')
    if #batch == 0 then return window end
    for i = 1, #batch, 2 do
      remaining = remaining - weight_of(batch[i])
      if remaining < limit then return tonumber(batch[i + 1]) + window - now end
    end
    start = start + 100
  end
end

-- Phase 1: check every bucket; nothing is reserved unless all have room.
-- used[i], reset[i]: the bucket's total and the wait until it is full again.
local used, reset = {}, {}
local function newest_reset(z)
  local e = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if #e == 0 then return 0 end
  return tonumber(e[2]) + window - now
end
local k, best_index, best_wait, best_daily = 1, 0, -1, false
for i = 1, n do
  local kind, limit = ARGV[4 + 2 * i], tonumber(ARGV[5 + 2 * i])
  local wait = nil
  if kind == 'requests' then
    local z = KEYS[k]; k = k + 1
    redis.call('ZREMRANGEBYSCORE', z, '-inf', cutoff)
    local count = redis.call('ZCARD', z)
    used[i], reset[i] = count, newest_reset(z)
    if count >= limit then
      local e = redis.call('ZRANGE', z, count - limit, count - limit, 'WITHSCORES')
      wait = tonumber(e[2]) + window - now
    end
  elseif kind == 'tokens' then
    local z, s = KEYS[k], KEYS[k + 1]; k = k + 2
    local total = purge_tokens(z, s)
    used[i], reset[i] = total, newest_reset(z)
    if total >= limit then wait = tokens_wait(z, total, limit) end
  else
    local raw = redis.call('GET', KEYS[k] .. ':' .. day); k = k + 1
    if not raw and seed then return {2, i, 0, now} end
    local spent = tonumber(raw or '0')
    used[i], reset[i] = spent, (spent > 0) and (midnight - now) or 0
    if spent >= limit then wait = midnight - now end
  end
  if wait and not best_daily then
    if kind == 'daily' then best_daily, best_index, best_wait = true, i, wait
    elseif wait > best_wait then best_index, best_wait = i, wait end
  end
end
local function with_states(reply)
  for i = 1, n do
    reply[#reply + 1] = used[i]
    reply[#reply + 1] = reset[i]
  end
  return reply
end
if best_index > 0 then return with_states({0, best_index, best_wait, now}) end

-- Phase 2: reserve in every bucket.
k = 1
for i = 1, n do
  local kind = ARGV[4 + 2 * i]
  if kind == 'requests' then
    redis.call('ZADD', KEYS[k], now, member)
    redis.call('PEXPIRE', KEYS[k], window + 1000); k = k + 1
    used[i], reset[i] = used[i] + 1, window
  elseif kind == 'tokens' then
    redis.call('ZADD', KEYS[k], now, member .. '|' .. cost)
    redis.call('INCRBY', KEYS[k + 1], cost)
    redis.call('PEXPIRE', KEYS[k], window + 1000)
    redis.call('PEXPIRE', KEYS[k + 1], window + 1000); k = k + 2
    used[i], reset[i] = used[i] + cost, window
  else
    local d = KEYS[k] .. ':' .. day
    redis.call('INCRBY', d, cost)
    redis.call('PEXPIRE', d, midnight + 3600000 - now); k = k + 1
    used[i] = used[i] + cost
    if used[i] > 0 then reset[i] = midnight - now end
  end
end
return with_states({1, day, now, 0})
"""
)

SETTLE_LUA = (
    _COMMON
    + r"""
local member, cost, used = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local day, n = ARGV[4], tonumber(ARGV[5])
local k = 1
for i = 1, n do
  if ARGV[5 + i] == 'tokens' then
    local z, s = KEYS[k], KEYS[k + 1]; k = k + 2
    local old = member .. '|' .. cost
    local score = redis.call('ZSCORE', z, old)
    if score and redis.call('EXISTS', s) == 1 then
      redis.call('ZREM', z, old)
      redis.call('ZADD', z, score, member .. '|' .. used)
      redis.call('INCRBY', s, used - cost)
    end
  else
    local d = KEYS[k] .. ':' .. day; k = k + 1
    if redis.call('EXISTS', d) == 1 then redis.call('INCRBY', d, used - cost) end
  end
end
return 1
"""
)


def shared_redis(url: str, *, max_connections: int) -> Any:
    """An asyncio client on a pool of its own, for state shared by gateway replicas
    (these counters, the Idempotency-Key answers of ``serve_app.requests.replays``).

    A blocking pool makes a burst wait for a free connection instead of
    failing: a busy pool is not an outage, and failing there would let the
    burst through unlimited (fail-open). Socket timeouts are a few seconds:
    short enough that a Redis outage does not stall requests for long, long
    enough that a loaded replica opening many connections at once does not
    mistake slowness for an outage (1 s did, under a 2-core burst test).

    A command that fails on a broken connection is sent once more, at once, on a
    new one: after Redis restarts (or fails over) every idle pooled connection
    still points at the old server, and without the retry the first command on each
    failed although Redis was back (a 503 with limits failing closed; seen in
    tests/faults). Timeouts are not retried: a hung Redis must not double the stall.
    A connection that broke after Redis ran the command (not before) means it runs
    twice: a claim recognises its own token (``serve_app.requests.replays``); an
    admission may count twice in a tokens or daily bucket, erring on the limit's side.
    """
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=10.0,
        socket_timeout=3.0,
        socket_connect_timeout=3.0,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )
    return aioredis.Redis(connection_pool=pool)


class RedisCounterStore:
    """``CounterStore`` on Redis; pass ``clock`` only to override Redis's time."""

    def __init__(
        self,
        redis: Any,
        *,
        prefix: str = "gw",
        window_s: float = 60.0,
        clock: Clock | None = None,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError("the Redis key prefix must not contain braces (hash tags)")
        self._redis = redis
        self._prefix = prefix
        self._window_ms = int(window_s * 1000)
        self._clock = clock
        self._admit = redis.register_script(ADMIT_LUA)
        self._settle = redis.register_script(SETTLE_LUA)

    @classmethod
    def from_url(cls, url: str, *, max_connections: int = 64, **kwargs: Any) -> RedisCounterStore:
        """A store on its own connection pool (``shared_redis``)."""
        return cls(shared_redis(url, max_connections=max_connections), **kwargs)

    def _keys(self, bucket: BucketSpec) -> list[str]:
        base = f"{self._prefix}:{bucket.key}"
        return [base, f"{base}:s"] if bucket.kind == "tokens" else [base]

    async def admit(
        self, member: str, buckets: Sequence[BucketSpec], cost: int, *, seed_daily: bool = False
    ) -> Ticket | Denial | SeedNeeded:
        keys = [key for bucket in buckets for key in self._keys(bucket)]
        now = "" if self._clock is None else str(round(self._clock() * 1000))
        args: list[str | int] = [now, self._window_ms, member, cost, len(buckets)]
        for bucket in buckets:
            args += [bucket.kind, bucket.limit]
        args.append("1" if seed_daily else "0")
        reply = await self._admit(keys=keys, args=args)
        if int(reply[0]) == 2:
            return SeedNeeded(buckets[int(reply[1]) - 1], int(reply[3]) // DAY_MS)
        states = tuple(
            BucketState(bucket, int(reply[4 + 2 * i]), int(reply[5 + 2 * i]))
            for i, bucket in enumerate(buckets)
        )
        if int(reply[0]) == 0:
            return Denial(buckets[int(reply[1]) - 1], int(reply[2]), states)
        return Ticket(member, cost, tuple(buckets), int(reply[1]), int(reply[2]), states)

    async def seed_daily(self, bucket: BucketSpec, day: int, used: int) -> None:
        """``SET NX``: a replica that seeded first (or a request counted since) wins."""
        ttl_ms = (day + 1) * DAY_MS + 3_600_000 - round(time.time() * 1000)
        key = f"{self._prefix}:{bucket.key}:{day}"
        await self._redis.set(key, used, nx=True, px=max(ttl_ms, 1000))

    async def settle(self, ticket: Ticket, used: int) -> None:
        buckets = ticket.settled_buckets()
        if not buckets:
            return
        keys = [key for bucket in buckets for key in self._keys(bucket)]
        args: list[str | int] = [ticket.member, ticket.cost, used, ticket.day, len(buckets)]
        args += [bucket.kind for bucket in buckets]
        await self._settle(keys=keys, args=args)

    async def aclose(self) -> None:
        await self._redis.aclose()
        await self._redis.connection_pool.disconnect()
