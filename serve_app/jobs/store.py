"""The ``video_jobs`` table: every state change of a job is one conditional statement.

The gateway and the video heads' workers only talk through this table, so
each transition states the status it expects and does nothing otherwise:

- ``create``: checks the per-user cap and inserts in one transaction that is
  serialised per user — ``BEGIN IMMEDIATE`` on SQLite (one writer at a time),
  a transaction-scoped advisory lock on the user on PostgreSQL (concurrent
  creates of one user queue; other users are not blocked). Without that lock
  two READ COMMITTED transactions would both count 1 and both insert.
- ``claim_next``: queued -> running for one worker (``FOR UPDATE SKIP LOCKED``
  on PostgreSQL, so workers of several replicas never wait on each other).
- ``heartbeat`` / ``complete`` / ``fail``: only while the job is still running
  and still this worker's; a cancelled or reconciled job is left alone, and a
  heartbeat that changes nothing tells the worker to stop.
- ``complete`` writes the usage record in the same transaction: a job is
  billed exactly when it becomes completed, never twice, never lost.
- ``cancel``: queued or running -> cancelled; a terminal job is unchanged
  (best effort, docs/reference/video.md#statuses).
- ``release``: running -> queued when a head replica stops gracefully (a
  redeploy, a scale-down), so another replica renders the job from the start.
- ``fail_stale`` / ``fail_unclaimed``: reconciliation of jobs whose worker died
  or that no worker could take (see ``serve_app.inference.video.service``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from serve_app.billing.store import LedgerStore
from serve_app.contract.video import VideoJobStore, VideoObjectStore
from serve_app.jobs.records import (
    CANCELLED,
    COMPLETED,
    FAILED,
    QUEUED,
    RUNNING,
    UNFINISHED,
    JobOwner,
    VideoJob,
    usage_record,
)
from serve_app.settings import get_settings
from serve_app.storage.db import Database
from serve_app.storage.migrations import SQLITE_BEGIN_OPTION
from serve_app.storage.objects import build_object_store
from serve_app.storage.pages import keyset_page
from serve_app.storage.schema import utcnow, video_jobs

_PG_USER_LOCK_CLASS = 61_803_398
"""First key of the per-user advisory lock (pg_advisory_xact_lock(int4, int4))."""

STALE_MESSAGE = (
    "The video worker stopped responding while generating (no heartbeat for {s:g} s); "
    "the job was not finished."
)

c = video_jobs.c


class JobStore:
    """Reads and conditional writes of ``video_jobs``; ``clock`` is injectable for tests."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = utcnow) -> None:
        self._db = db
        self._clock = clock
        self._ledger = LedgerStore(db)

    def now(self) -> datetime:
        return self._clock()

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """One write transaction; on SQLite the write lock is taken at BEGIN."""
        with self._db.engine.connect() as conn:
            if self._db.dialect == "sqlite":
                conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            with conn.begin():
                yield conn

    # ---- the gateway ------------------------------------------------------------------
    def create(self, job: VideoJob, cap: int, stale_after_s: float) -> bool:
        """Insert ``job`` unless its user already has ``cap`` unfinished jobs.

        The user's dead jobs are reconciled first, in the same transaction, so a
        worker that died never holds a user's quota.
        """
        with self._write() as conn:
            if self._db.dialect == "postgresql":
                lock = sa.func.pg_advisory_xact_lock(
                    sa.cast(sa.literal(_PG_USER_LOCK_CLASS), sa.Integer),
                    sa.func.hashtext(job.user_id),
                )
                conn.execute(sa.select(lock))
            self._fail_stale_on(conn, stale_after_s, user_id=job.user_id)
            unfinished = conn.execute(
                sa.select(sa.func.count())
                .select_from(video_jobs)
                .where(c.user_id == job.user_id, c.status.in_(UNFINISHED))
            ).scalar_one()
            if unfinished >= cap:
                return False
            conn.execute(sa.insert(video_jobs).values(**job.to_row()))
            return True

    def get(self, job_id: str, owner: JobOwner | None = None) -> VideoJob | None:
        """The job, or None when it does not exist or (with ``owner``) is not theirs."""
        query = sa.select(video_jobs).where(c.id == job_id)
        if owner is not None:
            query = query.where(*_owned_by(owner))
        with self._db.connect() as conn:
            row = conn.execute(query).mappings().first()
        return None if row is None else VideoJob.from_row(row)

    def list_recent(self, owner: JobOwner, limit: int) -> list[VideoJob]:
        """The owner's ``limit`` most recent jobs, newest first."""
        with self._db.connect() as conn:
            rows, _ = keyset_page(conn, video_jobs, _owned_by(owner), limit=limit)
        return [VideoJob.from_row(r) for r in rows]

    def cancel(self, job_id: str, owner: JobOwner) -> VideoJob | None:
        """Cancel the owner's job if it is unfinished; returns it as it is now."""
        with self._write() as conn:
            conn.execute(
                sa.update(video_jobs)
                .where(c.id == job_id, *_owned_by(owner), c.status.in_(UNFINISHED))
                .values(status=CANCELLED, finished_at=self.now())
            )
        return self.get(job_id, owner)

    def delete(self, job_id: str, owner: JobOwner) -> VideoJob | None:
        """Remove the owner's job, whatever its status; returns it as it was (None: not
        theirs). A worker still rendering it finds it gone: its heartbeat stops it, and a
        completion that matches no row removes the uploaded file (``deployments.video.head``)."""
        with self._write() as conn:
            row = (
                conn.execute(
                    sa.select(video_jobs).where(c.id == job_id, *_owned_by(owner)).with_for_update()
                )
                .mappings()
                .first()
            )
            if row is None:
                return None
            conn.execute(sa.delete(video_jobs).where(c.id == job_id))
        return VideoJob.from_row(row)

    # ---- the video head's worker ------------------------------------------------------
    def claim_next(self, model: str, worker: str) -> VideoJob | None:
        """Take the oldest queued job of ``model`` for ``worker`` (running), or None."""
        with self._write() as conn:
            job_id = conn.execute(
                sa.select(c.id)
                .where(c.model == model, c.status == QUEUED)
                .order_by(c.created_at, c.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).scalar()
            if job_id is None:
                return None
            now = self.now()
            taken = conn.execute(
                sa.update(video_jobs)
                .where(c.id == job_id, c.status == QUEUED)
                .values(status=RUNNING, worker=worker, started_at=now, heartbeat_at=now)
            ).rowcount
        return self.get(job_id) if taken == 1 else None

    def heartbeat(self, job_id: str, worker: str) -> bool:
        """Refresh the job's heartbeat; False when it is no longer this worker's to run."""
        with self._write() as conn:
            return bool(
                conn.execute(
                    sa.update(video_jobs)
                    .where(c.id == job_id, c.status == RUNNING, c.worker == worker)
                    .values(heartbeat_at=self.now())
                ).rowcount
            )

    def complete(
        self,
        job: VideoJob,
        worker: str,
        object_key: str,
        seconds: float,
        gen_seconds: float,
        stored_bytes: int | None = None,
    ) -> bool:
        """Mark the job completed and bill its seconds, together; False if it was not
        running for ``worker`` any more (cancelled, reconciled or deleted meanwhile).
        ``stored_bytes``, the MP4's size, counts in the organization's storage quota."""
        now = self.now()
        with self._write() as conn:
            done = conn.execute(
                sa.update(video_jobs)
                .where(c.id == job.id, c.status == RUNNING, c.worker == worker)
                .values(
                    status=COMPLETED,
                    object_key=object_key,
                    seconds=seconds,
                    gen_seconds=gen_seconds,
                    bytes=stored_bytes,
                    finished_at=now,
                    heartbeat_at=now,
                )
            ).rowcount
            if done == 1:
                self._ledger.insert_in(conn, [usage_record(job, seconds, now)])
        return done == 1

    def fail(self, job_id: str, worker: str, message: str) -> bool:
        """Mark the worker's running job failed with ``message``."""
        with self._write() as conn:
            return bool(
                conn.execute(
                    sa.update(video_jobs)
                    .where(c.id == job_id, c.status == RUNNING, c.worker == worker)
                    .values(status=FAILED, error=message[:2000], finished_at=self.now())
                ).rowcount
            )

    def release(self, job_id: str, worker: str) -> bool:
        """Put the worker's running job back in the queue (its replica is shutting down)."""
        with self._write() as conn:
            return bool(
                conn.execute(
                    sa.update(video_jobs)
                    .where(c.id == job_id, c.status == RUNNING, c.worker == worker)
                    .values(status=QUEUED, worker=None, started_at=None, heartbeat_at=None)
                ).rowcount
            )

    # ---- reconciliation -------------------------------------------------------------------
    def fail_stale(
        self, stale_after_s: float, *, user_id: str | None = None, model: str | None = None
    ) -> int:
        """Fail running jobs whose heartbeat is older than ``stale_after_s``."""
        with self._write() as conn:
            return self._fail_stale_on(conn, stale_after_s, user_id=user_id, model=model)

    def _fail_stale_on(
        self,
        conn: Connection,
        stale_after_s: float,
        *,
        user_id: str | None = None,
        model: str | None = None,
    ) -> int:
        now = self.now()
        query = sa.update(video_jobs).where(
            c.status == RUNNING, c.heartbeat_at < now - timedelta(seconds=stale_after_s)
        )
        if user_id is not None:
            query = query.where(c.user_id == user_id)
        if model is not None:
            query = query.where(c.model == model)
        message = STALE_MESSAGE.format(s=stale_after_s)
        return int(
            conn.execute(query.values(status=FAILED, error=message, finished_at=now)).rowcount
        )

    def fail_unclaimed(
        self, model: str, older_than_s: float, message: str, *, user_id: str | None = None
    ) -> int:
        """Fail queued jobs of ``model`` created more than ``older_than_s`` ago."""
        now = self.now()
        query = sa.update(video_jobs).where(
            c.model == model,
            c.status == QUEUED,
            c.created_at < now - timedelta(seconds=older_than_s),
        )
        if user_id is not None:
            query = query.where(c.user_id == user_id)
        with self._write() as conn:
            return int(
                conn.execute(query.values(status=FAILED, error=message, finished_at=now)).rowcount
            )


def _owned_by(owner: JobOwner) -> tuple[sa.ColumnElement[bool], ...]:
    """The conditions of a caller's own jobs: user *and* organization."""
    return (c.user_id == owner.user_id, c.org_id == owner.org_id)


def open_worker_stores() -> tuple[VideoJobStore[VideoJob], VideoObjectStore]:
    """A video head replica's job store (database migrated) and object store.

    The builder hands this function (not its result) to ``VideoHead``, which calls
    it in its replica: the stores come from the same ``GATEWAY_*`` environment as
    the gateway's, and ``deployments`` never imports this package. The return type
    is the contract's, so mypy checks that these stores offer what the worker calls.
    """
    settings = get_settings()
    database = Database.from_settings(settings)
    database.migrate()
    return JobStore(database), build_object_store(settings)
