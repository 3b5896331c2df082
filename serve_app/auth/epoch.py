"""The accounts generation: how every gateway replica learns that its auth cache is stale.

Verified keys are cached per replica (``AuthService``), so a revocation, a
changed limit or tool flag, or an org's external-provider switch must reach
every replica's cache. Three paths carry the news, from fastest to most
general; a replica clears its cache when any of them moved:

1. In-process: every ``AccountStore`` write bumps a counter kept in this process
   for its database. The single-process default (SQLite, no Redis, changes
   made through the same process) needs nothing else and sees a change on the
   very next request.
2. Redis (``GATEWAY_REDIS_URL``): the writer ``INCR``s ``AUTH_EPOCH_KEY`` after
   committing, and each replica reads that key on *every* request (one GET,
   the same round trip class as the rate limiter's). A change made by the
   CLI in another process or on another host is seen by the next request on
   every replica.
3. The database: the write also bumps the one-row ``auth_epoch`` table in the
   same transaction, and each replica re-reads it every ``DB_POLL_INTERVAL_S``.
   This covers writers without Redis (a CLI started without
   ``GATEWAY_REDIS_URL``, several processes on one SQLite file) and a Redis
   outage: such a change is seen within that interval (50 ms; the promise is
   100 ms). While requests flow, a background task on the replica's loop does
   the reading, so no request waits for the database (it cost ~1.2 ms of
   time-to-first-token when every 50 ms the request itself paid it, issue 14);
   after ``POLLER_IDLE_S`` without requests the task stops, so an idle replica
   does no reads, and the next request reads inline because its value is stale.
   (The reads cost ~0.025 of a core while they run: bench/RESULTS.md, 2026-11-26;
   on one kept connection, ``EpochReader``, a read costs 32-54 instead of 150 us of CPU
   on SQLite.)

The cache's TTL (``auth_cache_seconds``) stays as the last resort for edits
made to the database behind the store's back (hand-written SQL).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from serve_app.background import PeriodicLoop
from serve_app.storage.db import Database
from serve_app.storage.schema import auth_epoch

logger = logging.getLogger(__name__)

AUTH_EPOCH_KEY = "gateway:auth:epoch"
"""One key for every deployment sharing a Redis: a foreign bump only clears a cache."""

DB_POLL_INTERVAL_S = 0.05
POLLER_IDLE_S = 10.0

_local_lock = threading.Lock()
_local: dict[str, int] = {}


def _db_key(db: Database) -> str:
    return db.engine.url.render_as_string(hide_password=False)


def local_epoch(db: Database) -> int:
    """This process's count of account writes to ``db`` (path 1)."""
    with _local_lock:
        return _local.get(_db_key(db), 0)


def bump_local(db: Database) -> None:
    with _local_lock:
        key = _db_key(db)
        _local[key] = _local.get(key, 0) + 1


def bump_in_transaction(conn: Connection) -> None:
    """Path 3: called inside the writing transaction, so the bump commits with the change."""
    updated = conn.execute(sa.update(auth_epoch).values(value=auth_epoch.c.value + 1))
    if not updated.rowcount:
        conn.execute(sa.insert(auth_epoch).values(id=1, value=1))


EPOCH_SQL = "SELECT value FROM auth_epoch WHERE id = 1"
"""The read, as the driver runs it: compiled once by the database, not by SQLAlchemy."""


class EpochReader:
    """The poller's read, 20 times a second, on one connection it keeps.

    A pooled read checked a connection out (a ``SELECT 1`` ping first, the engine's
    ``pool_pre_ping``), had SQLAlchemy compile the select and reset the connection on
    return: the largest share of a gateway replica's Python time under a steady
    embeddings load after the request itself (py-spy, 15% of its GIL time). Here the
    connection is checked out once and each read ends its transaction (a kept
    SQLite read transaction would pin an old snapshot; a PostgreSQL one would sit
    "idle in transaction"). A failed read drops the connection; the next one checks
    out a fresh, pinged one. Reads come from the poller and from inline reads in
    worker threads: a lock keeps them off the connection at the same time.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    def read(self) -> int:
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self._db.engine.connect()
                value = self._conn.exec_driver_sql(EPOCH_SQL).scalar()
                self._conn.rollback()
            except Exception:
                self._drop()
                raise
        return int(value or 0)

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()  # never back into the pool: it may be the broken one
                conn.close()
            except Exception:
                logger.debug("closing the accounts generation reader failed", exc_info=True)


class RedisEpochPublisher:
    """Path 2 for writers (the CLI, in-process stores): ``INCR`` after a committed write.

    Synchronous on purpose: account writes are synchronous, rare, and already
    block on the database. A Redis failure is logged, never raised: the change
    is committed and the database path still carries it within 50 ms.
    """

    def __init__(self, url: str) -> None:
        import redis

        self._client: Any = redis.Redis.from_url(
            url, socket_timeout=2.0, socket_connect_timeout=2.0
        )

    def __call__(self) -> None:
        try:
            self._client.incr(AUTH_EPOCH_KEY)
        except Exception:
            logger.exception("could not publish the accounts change to Redis")

    def close(self) -> None:
        self._client.close()


Seen = tuple[int, int | None, int]
"""(in-process count, Redis value or None, database value): any change clears caches."""


class EpochWatch:
    """What one replica knows of the accounts generation (the three paths above).

    ``current`` runs per request on the event loop: one Redis GET when Redis is
    configured; the database value comes from the background poller, and is
    read inline only when the last read is older than twice ``poll_s`` (the
    poller is not running yet, stopped after idling, or stuck). ``current_sync``
    serves callers already off the loop (``authenticate``).
    """

    def __init__(
        self,
        db: Database,
        *,
        redis: Any | None = None,
        poll_s: float = DB_POLL_INTERVAL_S,
        idle_s: float = POLLER_IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = db
        self._reader = EpochReader(db)
        self._redis: Any = redis
        self._poll_s = poll_s
        self._idle_s = idle_s
        self._clock = clock
        self._db_value = 0
        self._db_read_at = -float("inf")  # when the value's read started
        self._db_claimed = -float("inf")  # when a caller last claimed an inline read
        self._last_request = -float("inf")
        self._poller = PeriodicLoop(
            self._poll_while_busy,
            poll_s,
            logger=logger,
            failure="the accounts generation poller failed",
            wait_first=True,
        )
        self._remote: int | None = None
        self._redis_failing = False
        self._db_failing = False  # log an outage once, not every poll (20 a second)

    def _stale(self) -> bool:
        return self._clock() - self._db_read_at >= 2 * self._poll_s

    def _claim_inline(self) -> bool:
        """One inline read per interval, however many requests find the value stale."""
        now = self._clock()
        if now - self._db_claimed < self._poll_s or not self._stale():
            return False
        self._db_claimed = now
        return True

    def _poll_db(self) -> None:
        started = self._clock()
        try:
            self._db_value = self._reader.read()
        except Exception:
            if not self._db_failing:
                logger.exception("could not read the accounts generation from the database")
            self._db_failing = True
            return
        if self._db_failing:
            logger.warning("the accounts generation is read from the database again")
        self._db_failing = False
        self._db_read_at = max(self._db_read_at, started)

    async def _poll_while_busy(self) -> bool:
        """One read; False once no request came for ``idle_s`` (until the next one)."""
        await asyncio.to_thread(self._poll_db)
        return self._clock() - self._last_request < self._idle_s

    def _ensure_poller(self) -> None:
        if self._idle_s > 0:  # started right after a request: busy, until idle_s passes
            self._poller.start()

    async def _read_redis(self) -> int | None:
        try:
            raw = await self._redis.get(AUTH_EPOCH_KEY)
        except Exception:
            if not self._redis_failing:
                logger.exception("could not read the accounts generation from Redis")
            self._redis_failing = True
            return None
        self._redis_failing = False
        return int(raw or 0)

    async def current(self) -> Seen:
        self._last_request = self._clock()
        self._ensure_poller()
        if self._redis is not None:
            self._remote = await self._read_redis()
        if self._claim_inline():
            await asyncio.to_thread(self._poll_db)
        return (local_epoch(self._db), self._remote, self._db_value)

    def current_sync(self) -> Seen:
        if self._claim_inline():
            self._poll_db()
        return (local_epoch(self._db), self._remote, self._db_value)

    async def aclose(self) -> None:
        await self._poller.stop()
        await asyncio.to_thread(self._reader.close)
        if self._redis is not None:
            await self._redis.aclose()

    @classmethod
    def build(cls, db: Database, redis_url: str | None) -> EpochWatch:
        """The watch of one gateway replica: Redis when configured, always the database."""
        client = None
        if redis_url:
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(
                redis_url, socket_timeout=1.0, socket_connect_timeout=1.0
            )
        return cls(db, redis=client)
