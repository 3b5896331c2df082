"""The ledger's durable local spool: JSONL files owned by one live ledger each.

Files of one owner ``<id>`` in the spool folder:

- ``<id>.lock``: held with ``flock(LOCK_EX)`` for the owner's whole life. The
  kernel drops the lock when the process dies, however it dies, so "I can
  take this lock" is exactly "its owner is gone".
- ``<id>.active.jsonl``: records acknowledged since the last rotation. Each is
  written as one line and flushed before ``submit`` returns.
- ``<id>.<seq>.batch.jsonl``: rotated files waiting for their SQL commit; a
  file is deleted only after its records are committed.

A new ledger claims the files of dead owners by renaming them into its own
batch names (atomic within one folder), so two claimers never both take one.
The lock file exists before any data file, so a live owner's files are never
claimed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import uuid
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

ACTIVE_SUFFIX = ".active.jsonl"
BATCH_SUFFIX = ".batch.jsonl"
LOCK_SUFFIX = ".lock"


def _try_lock(path: Path) -> int | None:
    """An fd holding ``path``'s exclusive lock, or None when someone holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _still_named(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


class Spool:
    """One owner's files; not thread-safe (the ledger serialises calls)."""

    def __init__(self, directory: Path, *, fsync: bool = False) -> None:
        self.directory = directory
        self.fsync = fsync
        self.owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._lock_fd: int | None = None
        self._active: IO[str] | None = None
        self._active_lines = 0
        self._seq = 0

    @property
    def is_open(self) -> bool:
        return self._lock_fd is not None

    @property
    def active_lines(self) -> int:
        return self._active_lines

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.owner}{LOCK_SUFFIX}"
        for _ in range(10):
            fd = _try_lock(path)
            if fd is None:
                raise RuntimeError(f"spool owner {self.owner} is already locked")
            if _still_named(fd, path):
                break
            # A claimer took the new lock file for a dead owner's and unlinked it between
            # our create and our lock: a lock on an unlinked file protects nothing.
            os.close(fd)
        else:
            raise RuntimeError(f"could not lock {path}")
        self._lock_fd = fd
        self._active = open(self._active_path(), "a", encoding="utf-8")  # noqa: SIM115

    def _active_path(self) -> Path:
        return self.directory / f"{self.owner}{ACTIVE_SUFFIX}"

    def _next_batch_path(self) -> Path:
        self._seq += 1
        return self.directory / f"{self.owner}.{self._seq:010d}{BATCH_SUFFIX}"

    def append(self, record: dict[str, Any]) -> None:
        """Write one record durably enough to survive this process dying."""
        if self._active is None:
            raise RuntimeError("the spool is closed")
        self._active.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._active.flush()
        if self.fsync:
            os.fsync(self._active.fileno())
        self._active_lines += 1

    def rotate(self) -> None:
        """Turn the active file into a batch file (if it holds anything)."""
        if self._active is None or self._active_lines == 0:
            return
        self._active.close()
        os.replace(self._active_path(), self._next_batch_path())
        self._active = open(self._active_path(), "a", encoding="utf-8")  # noqa: SIM115
        self._active_lines = 0

    def set_aside(self, records: list[dict[str, Any]]) -> Path:
        """Write ``records`` to a new batch file of this owner (records the ledger
        could not store: kept whole for another process, never dropped)."""
        path = self._next_batch_path()
        with open(path, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            handle.flush()
            if self.fsync:
                os.fsync(handle.fileno())
        return path

    def batches(self) -> list[Path]:
        """This owner's batch files, oldest first."""
        return sorted(self.directory.glob(f"{self.owner}.*{BATCH_SUFFIX}"))

    def claim_orphans(self) -> int:
        """Adopt the files of owners whose lock is free; returns files adopted.

        Owners are found from lock files and from data files alike, so files whose
        lock file is missing (removed by hand, or a crash mid-cleanup) are adopted too.
        """
        adopted = 0
        for other in sorted(self._owners() - {self.owner}):
            lock = self.directory / f"{other}{LOCK_SUFFIX}"
            fd = _try_lock(lock)
            if fd is None:
                continue  # alive
            try:
                adopted += self._adopt(other)
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
            finally:
                os.close(fd)
        return adopted

    def _owners(self) -> set[str]:
        owners = set()
        for path in self.directory.iterdir():
            name = path.name
            if name.endswith(LOCK_SUFFIX):
                owners.add(name[: -len(LOCK_SUFFIX)])
            elif name.endswith(ACTIVE_SUFFIX):
                owners.add(name[: -len(ACTIVE_SUFFIX)])
            elif name.endswith(BATCH_SUFFIX):
                owners.add(name[: -len(BATCH_SUFFIX)].rsplit(".", 1)[0])  # <owner>.<seq>
        return owners

    def _adopt(self, other: str) -> int:
        files = sorted(self.directory.glob(f"{other}.*{BATCH_SUFFIX}"))
        active = self.directory / f"{other}{ACTIVE_SUFFIX}"
        if active.exists():
            files.append(active)  # newest records of the dead owner come last
        for path in files:
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, self._next_batch_path())
        if files:
            logger.warning("ledger spool: adopted %d file(s) of dead owner %s", len(files), other)
        return len(files)

    def close(self) -> None:
        """Release the lock; leftover files stay for the next ledger to replay."""
        if self._active is not None:
            self._active.close()
            self._active = None
            if self._active_lines == 0:
                with contextlib.suppress(FileNotFoundError):
                    self._active_path().unlink()
        if self._lock_fd is not None:
            if not self.batches() and not self._active_path().exists():
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / f"{self.owner}{LOCK_SUFFIX}").unlink()
            os.close(self._lock_fd)
            self._lock_fd = None


def read_batch(path: Path) -> list[dict[str, Any]]:
    """The records of a spool file; a torn last line (crash mid-write) is skipped."""
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                logger.error("ledger spool %s line %d unreadable; skipped", path.name, number)
    return records
