"""The usage ledger: records leave the request path at once, reach SQL in batches.

``submit`` appends the record to a local spool file and returns (one small
buffered write, no database round trip on the request's path). A background
task rotates the spool, inserts each rotated file in one transaction with
insert-or-ignore on ``request_id``, and deletes the file only after the commit.
Hence:

- a replica that dies after ``submit`` loses nothing: its files stay behind
  and the next ledger started on the same spool folder (the restarted replica,
  or any other replica on the machine) adopts and commits them;
- a replica that dies after the commit but before deleting the file replays
  it later, and the insert-or-ignore turns the replay into a no-op;
- a database outage only delays records: files wait, retried with backoff;
- a record this process cannot store (a line from a newer version, a value
  the database refuses) never blocks the others: it is set aside in a file of
  its own, skipped by this process and kept for the next owner of the spool.

The spool is per machine: with ``state_dir`` on local disk, a replica's files
are replayed by gateway replicas on the same node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

from serve_app.billing.records import UsageRecord
from serve_app.billing.spool import Spool, read_batch
from serve_app.billing.store import LedgerStore
from serve_app.storage.db import database_unreachable

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
ORPHAN_SCAN_S = 60.0


class UsageLedger:
    """Durable, batched, idempotent writer of ``UsageRecord`` rows."""

    def __init__(
        self,
        store: LedgerStore,
        spool_dir: Path,
        *,
        flush_interval_s: float = 1.0,
        batch_size: int = 500,
        fsync: bool = False,
    ) -> None:
        self.store = store
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self._spool = Spool(spool_dir, fsync=fsync)
        self._lock = threading.Lock()  # submit vs rotate, whatever thread calls
        self._commit_lock = threading.Lock()  # one commit round at a time
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._next_orphan_scan = 0.0
        self._held: set[str] = set()  # batch files set aside: records this code cannot store

    @property
    def spool_dir(self) -> Path:
        return self._spool.directory

    def _open(self) -> None:
        with self._lock:
            if not self._spool.is_open and not self._closed:
                self._spool.open()

    async def start(self) -> None:
        """Open the spool and start the flusher, which first adopts dead owners' files."""
        self._open()
        if self._task is None and not self._closed:
            self._start_in_running_loop()

    def submit(self, record: UsageRecord) -> None:
        """Acknowledge a record: durable in the spool when this returns."""
        if self._closed:
            raise RuntimeError("the usage ledger is closed")
        self._open()
        with self._lock:
            self._spool.append(record.to_json())
            full = self._spool.active_lines >= self.batch_size
        if self._task is None:
            self._start_in_running_loop()
        elif full and self._wake is not None:
            self._wake.set()

    def _start_in_running_loop(self) -> None:
        """Start the flusher lazily (apps that never called ``start``, e.g. tests)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: records wait in the spool for flush() or the next start
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        delay = 0.0  # first round at once: adopt what dead owners left behind
        while not self._closed:
            assert self._wake is not None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            try:
                ok = await self.flush()
            except Exception:  # the flusher must outlive any one bad round
                logger.exception("ledger flush failed")
                ok = False
            delay = self.flush_interval_s if ok else min(max(delay, 0.5) * 2, MAX_BACKOFF_S)

    async def flush(self) -> bool:
        """Commit everything spooled so far (off the event loop); False if SQL failed."""
        with self._lock:
            if self._spool.is_open:
                self._spool.rotate()
        return await asyncio.to_thread(self._commit_pending)

    def _commit_pending(self) -> bool:
        with self._commit_lock:
            return self._commit_round()

    def _commit_round(self) -> bool:
        if not self._spool.is_open:
            return True
        if time.monotonic() >= self._next_orphan_scan:
            self._next_orphan_scan = time.monotonic() + ORPHAN_SCAN_S
            with self._lock:  # claiming names batch files, as rotate does
                self._spool.claim_orphans()
        for path in self._spool.batches():
            if path.name in self._held:
                continue
            try:
                rejected = self._commit_file(path)
            except Exception:
                logger.warning("ledger: committing %s failed; will retry", path.name, exc_info=True)
                return False
            if rejected:
                with self._lock:  # a new batch name, as rotate takes one
                    held = self._spool.set_aside(rejected)
                self._held.add(held.name)
                logger.error(
                    "ledger: %d record(s) of %s cannot be stored by this process; kept in %s",
                    len(rejected),
                    path.name,
                    held.name,
                )
            path.unlink()  # only after the commit: a crash before this means a replay
        return True

    def _commit_file(self, path: Path) -> list[dict[str, Any]]:
        """Insert a spool file's records; return those that cannot be stored.

        One transaction for the file; when the database refuses it for a reason
        other than being unreachable, the records go one by one so only the
        offending ones are left out. An unreachable database raises (retry later).
        """
        rejected: list[dict[str, Any]] = []
        records: list[UsageRecord] = []
        for item in read_batch(path):
            try:
                records.append(UsageRecord.from_json(item))
            except (TypeError, ValueError, KeyError):
                rejected.append(item)
        try:
            self.store.insert(records)
        except Exception as exc:
            if _unreachable(exc):
                raise
            for record in records:
                try:
                    self.store.insert([record])
                except Exception as one:
                    if _unreachable(one):
                        raise
                    rejected.append(record.to_json())
        return rejected

    async def aclose(self) -> None:
        """Stop the flusher, commit what is spooled (if the database allows), release."""
        if self._closed:
            return
        task, self._task = self._task, None
        self._closed = True
        if self._wake is not None:
            self._wake.set()
        if task is not None and task.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with self._lock:
            if self._spool.is_open:
                self._spool.rotate()
        await asyncio.to_thread(self._commit_pending)
        with self._lock:
            self._spool.close()


def _unreachable(exc: BaseException) -> bool:
    """The database (not the record) is the problem: retry the whole round later."""
    return database_unreachable(exc) or isinstance(exc, OSError)
