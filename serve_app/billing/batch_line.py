"""The batch line a request runs for, if any: how the live services bill a batch line.

A batch worker (``serve_app.batches.worker``) runs each line through the very same
services as a live request. Those services meter as they always do; two places ask
whether the request is a batch line:

- ``Metering.record`` does not spool the line's usage record: it prices it at the
  batch discount under the line's deterministic ledger key and hands it to the
  ``BatchLine``; the worker then commits it in the transaction that stores the
  line's result, so a line is billed exactly when its result is kept, once;
- ``RateLimiter.admit`` checks only the daily quota: batch work has its own limit
  (enqueued tokens per organization) instead of the live RPM/TPM.

A ``ContextVar`` carries it because the services' signatures are the routes' and a
line's request runs in one task (the worker's), where the variable is set.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from serve_app.billing.records import UsageRecord


@dataclass
class BatchLine:
    """One line being run: its ledger key, batch and discount; the records it produced."""

    request_id: str
    batch_id: str
    discount: float
    records: list[UsageRecord] = field(default_factory=list)

    def record_id(self) -> str:
        """The ledger key of the next record: the line's key, suffixed after the first
        (a line normally produces one record; the suffix keeps any further one distinct
        and still deterministic)."""
        n = len(self.records)
        return self.request_id if n == 0 else f"{self.request_id}.{n}"


_current: ContextVar[BatchLine | None] = ContextVar("batch_line", default=None)


def current_batch_line() -> BatchLine | None:
    """The batch line this task runs, or None for a live request."""
    return _current.get()


@contextmanager
def running_batch_line(line: BatchLine) -> Iterator[BatchLine]:
    """Mark the current task (and tasks it starts) as running ``line``."""
    token = _current.set(line)
    try:
        yield line
    finally:
        _current.reset(token)
