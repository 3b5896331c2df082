"""The ``batches`` and ``batch_lines`` tables: every state change is one conditional
statement, so gateway replicas and their workers coordinate through the database only.

- Lines are claimed under a lease (``running``, ``lease_owner``, ``lease_expires_at``,
  ``FOR UPDATE SKIP LOCKED`` on PostgreSQL) and heartbeated while they run; a line
  whose worker died is claimed again once its lease has passed.
- ``complete_line`` stores a line's result and its usage records in one transaction,
  only while the line is still the worker's and the batch not frozen for
  finalization (it holds the batch row shared, so a finalization waits for it): a
  line is kept, and billed, exactly once.
- The batch-level stages (validation, finalization) are claimed with a lease on the
  batch row. Finalization first freezes the batch (``finalizing_at``): from then on
  no line is claimed or completed, so the output assembled from the stored results
  is final; a finalizer that dies is replaced after its lease, and writes the same
  files again (their ids are derived from the batch's).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from serve_app.batches.records import (
    CANCELLING,
    ENQUEUED,
    FINALIZING,
    IN_PROGRESS,
    LINE_DONE,
    LINE_FAILED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    VALIDATING,
    BatchRecord,
    ClaimedLine,
    LineResult,
    LineTally,
    StoredLine,
)
from serve_app.billing.records import UsageRecord
from serve_app.billing.store import LedgerStore
from serve_app.files.store import FileRecord, FileStore
from serve_app.storage.db import Database
from serve_app.storage.pages import keyset_page
from serve_app.storage.schema import batch_lines, batches

_SIZES_PAGE = 1000
"""Lines whose result sizes one read of ``result_pages`` plans."""
_PG_ORG_LOCK_CLASS = 61_803_399
"""First key of the per-organization advisory lock of the enqueued-token check."""

b = batches.c
ln = batch_lines.c


class BatchStore:
    """Reads and conditional writes of batches and their lines."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._ledger = LedgerStore(db)
        self._files = FileStore(db)

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self._db.begin() as conn:
            yield conn

    # ---- the API ----------------------------------------------------------------------
    def create(self, record: BatchRecord) -> None:
        with self._write() as conn:
            conn.execute(sa.insert(batches).values(**record.to_row()))

    def get(self, batch_id: str, org_id: str | None = None) -> BatchRecord | None:
        query = sa.select(batches).where(b.id == batch_id)
        if org_id is not None:
            query = query.where(b.org_id == org_id)
        with self._db.connect() as conn:
            row = conn.execute(query).mappings().first()
        return None if row is None else BatchRecord.from_row(row)

    def page(self, org_id: str, limit: int, after: str | None) -> tuple[list[BatchRecord], bool]:
        """The org's batches newest first, after the batch ``after``; whether more follow."""
        with self._db.connect() as conn:
            rows, more = keyset_page(conn, batches, [b.org_id == org_id], limit=limit, after=after)
        return [BatchRecord.from_row(r) for r in rows], more

    def line_counts(self, batch_id: str) -> tuple[int, int]:
        """(succeeded, failed) lines so far: a running batch's ``request_counts``."""
        query = (
            sa.select(ln.status, sa.func.count())
            .where(ln.batch_id == batch_id, ln.status.in_(LINE_DONE))
            .group_by(ln.status)
        )
        with self._db.connect() as conn:
            counts = {status: int(n) for status, n in conn.execute(query)}
        return counts.get("succeeded", 0), counts.get("failed", 0)

    def cancel(self, batch_id: str, org_id: str, now: datetime) -> BatchRecord | None:
        """validating / in_progress -> cancelling; any other status is left as it is."""
        with self._write() as conn:
            conn.execute(
                sa.update(batches)
                .where(
                    b.id == batch_id,
                    b.org_id == org_id,
                    b.status.in_((VALIDATING, IN_PROGRESS)),
                    b.finalizing_at.is_(None),
                )
                .values(status=CANCELLING, cancelling_at=now)
            )
        return self.get(batch_id, org_id)

    def has_work(self) -> bool:
        """Whether any batch is unfinished: one read, so an idle worker's poll takes no
        write lock (SQLite has one writer at a time)."""
        query = sa.select(b.id).where(
            b.status.in_((VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING))
        )
        with self._db.connect() as conn:
            return conn.execute(query.limit(1)).first() is not None

    # ---- batch stages (validation, finalization) -----------------------------------------
    def claim_stage(self, worker: str, now: datetime, lease_s: float) -> BatchRecord | None:
        """A batch with a stage due, leased to ``worker``: validating; frozen for
        finalization; cancelling or expired with no line running under a live lease;
        in progress with every line done."""
        live_running = sa.exists().where(
            ln.batch_id == b.id, ln.status == RUNNING, ln.lease_expires_at > now
        )
        open_lines = sa.exists().where(ln.batch_id == b.id, ln.status.in_((PENDING, RUNNING)))
        due = sa.or_(
            b.status == VALIDATING,
            b.finalizing_at.is_not(None),
            sa.and_(b.status == CANCELLING, ~live_running),
            sa.and_(b.status == IN_PROGRESS, b.expires_at <= now, ~live_running),
            sa.and_(b.status == IN_PROGRESS, ~open_lines),
        )
        free = sa.or_(b.lease_expires_at.is_(None), b.lease_expires_at < now)
        with self._write() as conn:
            batch_id = conn.execute(
                sa.select(b.id)
                .where(b.status.in_((VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)), due, free)
                .order_by(b.created_at)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).scalar()
            if batch_id is None:
                return None
            taken = conn.execute(
                sa.update(batches)
                .where(b.id == batch_id, free)
                .values(lease_owner=worker, lease_expires_at=now + timedelta(seconds=lease_s))
            ).rowcount
        return self.get(batch_id) if taken == 1 else None

    def release_stage(self, batch_id: str, worker: str) -> None:
        with self._write() as conn:
            conn.execute(
                sa.update(batches)
                .where(b.id == batch_id, b.lease_owner == worker)
                .values(lease_owner=None, lease_expires_at=None)
            )

    def start(
        self,
        batch: BatchRecord,
        worker: str,
        lines: tuple[Iterable[dict[str, Any]], int],
        estimated_tokens: int,
        token_limit: int | None,
        now: datetime,
    ) -> int | None:
        """validating -> in_progress with its lines, unless the organization's enqueued
        tokens would pass ``token_limit``: then nothing is written and the tokens
        already enqueued are returned (the caller fails the batch). Serialised per
        organization (advisory lock on PostgreSQL, the write lock on SQLite).
        ``lines``: the rows and their count; the rows are read (from the validation's
        spool) and inserted a thousand at a time."""
        rows, total = lines
        with self._write() as conn:
            if self._db.dialect == "postgresql":
                lock = sa.func.pg_advisory_xact_lock(
                    sa.cast(sa.literal(_PG_ORG_LOCK_CLASS), sa.Integer),
                    sa.func.hashtext(batch.org_id),
                )
                conn.execute(sa.select(lock))
            if token_limit is not None:
                enqueued = int(
                    conn.execute(
                        sa.select(sa.func.coalesce(sa.func.sum(b.estimated_tokens), 0)).where(
                            b.org_id == batch.org_id, b.status.in_(ENQUEUED)
                        )
                    ).scalar_one()
                )
                if enqueued + estimated_tokens > token_limit:
                    return enqueued
            moved = conn.execute(
                sa.update(batches)
                .where(b.id == batch.id, b.status == VALIDATING, b.lease_owner == worker)
                .values(
                    status=IN_PROGRESS,
                    in_progress_at=now,
                    total=total,
                    estimated_tokens=estimated_tokens,
                    lease_owner=None,
                    lease_expires_at=None,
                )
            ).rowcount
            if moved == 1:
                page: list[dict[str, Any]] = []
                for line in rows:
                    page.append({**line, "batch_id": batch.id, "status": PENDING})
                    if len(page) == 1000:
                        conn.execute(sa.insert(batch_lines), page)
                        page = []
                if page:
                    conn.execute(sa.insert(batch_lines), page)
        return None

    def fail(self, batch_id: str, worker: str, errors: str, total: int, now: datetime) -> bool:
        """validating -> failed with its validation errors (a JSON list)."""
        with self._write() as conn:
            return bool(
                conn.execute(
                    sa.update(batches)
                    .where(b.id == batch_id, b.status == VALIDATING, b.lease_owner == worker)
                    .values(
                        status="failed",
                        failed_at=now,
                        errors=errors,
                        total=total,
                        lease_owner=None,
                        lease_expires_at=None,
                    )
                ).rowcount
            )

    def freeze(self, batch_id: str, worker: str, now: datetime, finalizing: bool) -> bool:
        """Stop every claim and completion of the batch's lines; ``finalizing``: a running
        batch shows status ``finalizing`` (a completion; a cancel keeps ``cancelling``)."""
        values: dict[str, Any] = {"finalizing_at": now}
        if finalizing:
            values["status"] = sa.case((b.status == IN_PROGRESS, FINALIZING), else_=b.status)
        with self._write() as conn:
            return bool(
                conn.execute(
                    sa.update(batches)
                    .where(
                        b.id == batch_id,
                        b.lease_owner == worker,
                        b.finalizing_at.is_(None),
                    )
                    .values(**values)
                ).rowcount
            )

    def line_tally(self, batch_id: str) -> LineTally:
        """The batch's lines by status, counted in SQL: no result is read."""
        query = (
            sa.select(ln.status, sa.func.count()).where(ln.batch_id == batch_id).group_by(ln.status)
        )
        with self._db.connect() as conn:
            counts = {status: int(n) for status, n in conn.execute(query)}
        return LineTally(sum(counts.values()), counts.get(SUCCEEDED, 0), counts.get(LINE_FAILED, 0))

    def result_pages(self, batch_id: str, page_bytes: int) -> Iterator[list[StoredLine]]:
        """The batch's lines with their results in input order, in pages of about
        ``page_bytes`` of results (a larger result alone), so no reader holds them all:
        the sizes of the next ``_SIZES_PAGE`` lines are read first, then their results
        in runs that fit the budget."""
        after = -1
        while True:
            with self._db.connect() as conn:
                sizes = conn.execute(
                    sa.select(ln.line, sa.func.coalesce(sa.func.length(ln.result), 0))
                    .where(ln.batch_id == batch_id, ln.line > after)
                    .order_by(ln.line)
                    .limit(_SIZES_PAGE)
                ).all()
            if not sizes:
                return
            for first, last in _runs([(int(n), int(size)) for n, size in sizes], page_bytes):
                with self._db.connect() as conn:
                    rows = conn.execute(
                        sa.select(ln.line, ln.custom_id, ln.status, ln.result)
                        .where(ln.batch_id == batch_id, ln.line >= first, ln.line <= last)
                        .order_by(ln.line)
                    ).all()
                yield [StoredLine(*row) for row in rows]
            after = int(sizes[-1][0])

    def finish(
        self,
        batch_id: str,
        worker: str,
        status: str,
        counts: tuple[int, int, int],
        output: FileRecord | None,
        error: FileRecord | None,
        now: datetime,
    ) -> bool:
        """A frozen batch -> its terminal ``status``, with its output and error files."""
        total, completed, failed = counts
        with self._write() as conn:
            done = conn.execute(
                sa.update(batches)
                .where(b.id == batch_id, b.lease_owner == worker, b.finalizing_at.is_not(None))
                .values(
                    status=status,
                    total=total,
                    completed=completed,
                    failed=failed,
                    output_file_id=None if output is None else output.id,
                    error_file_id=None if error is None else error.id,
                    lease_owner=None,
                    lease_expires_at=None,
                    **{f"{status}_at": now},
                )
            ).rowcount
            if done == 1:
                for record in (output, error):
                    if record is not None:
                        self._files.insert_in(conn, record)
        return done == 1

    # ---- lines ---------------------------------------------------------------------------
    def claim_lines(self, worker: str, n: int, now: datetime, lease_s: float) -> list[ClaimedLine]:
        """Up to ``n`` lines of running batches (oldest batch first): pending, or running
        under a lease that has passed (their worker died)."""
        claimable = sa.and_(
            ln.batch_id == b.id,
            b.status == IN_PROGRESS,
            b.finalizing_at.is_(None),
            b.expires_at > now,
            sa.or_(ln.status == PENDING, sa.and_(ln.status == RUNNING, ln.lease_expires_at < now)),
        )
        query = (
            sa.select(
                ln.batch_id, ln.line, ln.custom_id, ln.body, ln.attempts, b.endpoint, b.key_id
            )
            .where(claimable)
            .order_by(b.created_at, ln.batch_id, ln.line)
            .limit(n)
        )
        if self._db.dialect == "postgresql":
            query = query.with_for_update(skip_locked=True, of=batch_lines)
        claimed: list[ClaimedLine] = []
        lease = now + timedelta(seconds=lease_s)
        with self._write() as conn:
            for row in conn.execute(query).all():
                taken = conn.execute(
                    sa.update(batch_lines)
                    .where(
                        ln.batch_id == row.batch_id,
                        ln.line == row.line,
                        sa.or_(
                            ln.status == PENDING,
                            sa.and_(ln.status == RUNNING, ln.lease_expires_at < now),
                        ),
                    )
                    .values(
                        status=RUNNING,
                        lease_owner=worker,
                        lease_expires_at=lease,
                        attempts=ln.attempts + 1,
                    )
                ).rowcount
                if taken == 1:
                    claimed.append(
                        ClaimedLine(
                            row.batch_id,
                            row.line,
                            row.custom_id,
                            row.body,
                            row.attempts + 1,
                            row.endpoint,
                            row.key_id,
                        )
                    )
        return claimed

    def heartbeat(
        self,
        worker: str,
        now: datetime,
        lease_s: float,
        lines: Sequence[tuple[str, int]],
        stage: str | None,
    ) -> int:
        """Extend the leases of ``lines`` ((batch id, line) pairs) and of ``stage``'s batch,
        those of them ``worker`` still holds: what it is running now, never everything
        under its name (a line it gave up on must lapse to be claimed again)."""
        lease = now + timedelta(seconds=lease_s)
        by_batch: dict[str, list[int]] = {}
        for batch_id, number in lines:
            by_batch.setdefault(batch_id, []).append(number)
        renewed = 0
        with self._write() as conn:
            for batch_id, numbers in by_batch.items():
                renewed += conn.execute(
                    sa.update(batch_lines)
                    .where(
                        ln.batch_id == batch_id,
                        ln.line.in_(numbers),
                        ln.lease_owner == worker,
                        ln.status == RUNNING,
                    )
                    .values(lease_expires_at=lease)
                ).rowcount
            if stage is not None:
                conn.execute(
                    sa.update(batches)
                    .where(b.id == stage, b.lease_owner == worker)
                    .values(lease_expires_at=lease)
                )
        return renewed

    def complete_line(
        self,
        line: ClaimedLine,
        worker: str,
        result: LineResult,
        records: Sequence[UsageRecord],
        output: str,
        now: datetime,
    ) -> bool:
        """Keep the line's result and bill its records, together; False (nothing kept,
        nothing billed) when the line is no longer this worker's or its batch is frozen."""
        with self._write() as conn:
            open_batch = sa.select(b.id).where(
                b.id == line.batch_id,
                b.status.in_((IN_PROGRESS, CANCELLING)),
                b.finalizing_at.is_(None),
            )
            if self._db.dialect == "postgresql":
                open_batch = open_batch.with_for_update(read=True)  # a finalization waits
            if conn.execute(open_batch).first() is None:
                return False
            done = conn.execute(
                sa.update(batch_lines)
                .where(
                    ln.batch_id == line.batch_id,
                    ln.line == line.line,
                    ln.status == RUNNING,
                    ln.lease_owner == worker,
                )
                .values(
                    status=result.status,
                    result=output,
                    finished_at=now,
                    lease_owner=None,
                    lease_expires_at=None,
                )
            ).rowcount
            if done == 1 and records:
                self._ledger.insert_in(conn, records)
        return done == 1

    def defer_line(self, line: ClaimedLine, worker: str, until: datetime) -> bool:
        """Give the line up until ``until`` (its model could not take it now: a 503); the
        try does not count against its attempts."""
        with self._write() as conn:
            return bool(
                conn.execute(
                    sa.update(batch_lines)
                    .where(
                        ln.batch_id == line.batch_id,
                        ln.line == line.line,
                        ln.status == RUNNING,
                        ln.lease_owner == worker,
                    )
                    .values(lease_owner=None, lease_expires_at=until, attempts=ln.attempts - 1)
                ).rowcount
            )

    def release_lines(self, worker: str) -> None:
        """Put the worker's running lines back (a graceful stop): claimable at once."""
        with self._write() as conn:
            conn.execute(
                sa.update(batch_lines)
                .where(ln.lease_owner == worker, ln.status == RUNNING)
                .values(
                    status=PENDING,
                    lease_owner=None,
                    lease_expires_at=None,
                    attempts=ln.attempts - 1,  # a stop is not the line's fault
                )
            )


def _runs(sizes: list[tuple[int, int]], budget: int) -> Iterator[tuple[int, int]]:
    """(first, last) line numbers of consecutive runs whose sizes sum to at most
    ``budget``; a line larger than the budget is a run of its own."""
    first, total = sizes[0][0], 0
    previous = first
    for line, size in sizes:
        if total and total + size > budget:
            yield first, previous
            first, total = line, 0
        total += size
        previous = line
    yield first, previous
