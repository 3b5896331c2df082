"""A batch and its lines as rows, and their ids.

A line's ledger key and output ``id`` are derived from (batch id, custom_id), so
every run of a line (a retry after its worker died) bills under the same key: the
ledger's insert-or-ignore stores it once.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from serve_app.storage.schema import batches

VALIDATING = "validating"
FAILED = "failed"
IN_PROGRESS = "in_progress"
FINALIZING = "finalizing"
COMPLETED = "completed"
EXPIRED = "expired"
CANCELLING = "cancelling"
CANCELLED = "cancelled"
UNFINISHED = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)
ENQUEUED = (IN_PROGRESS, FINALIZING, CANCELLING)
"""Statuses whose estimated tokens count against the organization's batch token limit."""

PENDING = "pending"
RUNNING = "running"
SUCCEEDED = "succeeded"
LINE_FAILED = "failed"
LINE_DONE = (SUCCEEDED, LINE_FAILED)


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def line_request_id(batch_id: str, custom_id: str) -> str:
    """The line's ledger key, output ``id`` and ``response.request_id``: deterministic."""
    digest = hashlib.sha256(f"{batch_id}\n{custom_id}".encode()).hexdigest()[:32]
    return f"batch_req_{digest}"


def output_file_id(batch_id: str, kind: str) -> str:
    """The output (``kind`` "output") or error ("error") file of a batch: deterministic,
    so a finalization run again after a crash writes the same file, not a second one."""
    digest = hashlib.sha256(f"{batch_id}\n{kind}".encode()).hexdigest()[:24]
    return f"file-{digest}"


@dataclass(frozen=True)
class BatchRecord:
    """A row of ``batches``."""

    id: str
    org_id: str
    user_id: str
    key_id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    meta: str | None
    status: str
    output_file_id: str | None
    error_file_id: str | None
    errors: str | None
    total: int
    completed: int
    failed: int
    estimated_tokens: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    expires_at: datetime
    in_progress_at: datetime | None = None
    finalizing_at: datetime | None = None
    completed_at: datetime | None = None
    failed_at: datetime | None = None
    expired_at: datetime | None = None
    cancelling_at: datetime | None = None
    cancelled_at: datetime | None = None

    def to_row(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_row(cls, row: Any) -> BatchRecord:
        return cls(**{name: row[name] for name in _BATCH_COLUMNS})

    def metadata(self) -> dict[str, str] | None:
        return None if self.meta is None else dict(json.loads(self.meta))


_BATCH_COLUMNS = tuple(col.name for col in batches.columns)


@dataclass(frozen=True)
class ClaimedLine:
    """A line a worker holds under lease, with what it needs of its batch to run it."""

    batch_id: str
    line: int
    custom_id: str
    body: str
    attempts: int
    endpoint: str
    key_id: str


@dataclass(frozen=True)
class LineResult:
    """A line's outcome as stored: ``succeeded`` or ``failed`` and its output line (JSON)."""

    status: str
    output: str


@dataclass(frozen=True)
class LineTally:
    """A batch's lines by status: what finalization counts without reading any result."""

    total: int
    succeeded: int
    failed: int

    @property
    def open(self) -> int:
        """Lines not done (pending or running)."""
        return self.total - self.succeeded - self.failed


@dataclass(frozen=True)
class StoredLine:
    """A line as read back at finalization."""

    line: int
    custom_id: str
    status: str
    result: str | None
