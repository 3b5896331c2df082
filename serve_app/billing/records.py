"""One usage record per request: what was consumed and the price applied to it.

A record is flat on purpose: it is a spool line (JSON), a database row and a
billing fact at once, and all three must agree. The price used is copied into
the record (not looked up later) so a catalog price change never rewrites
history. ``request_id`` is the idempotency key: writing a record twice stores
it once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

UsageStatus = Literal["ok", "partial", "aborted"]
"""ok: finished; partial: the upstream broke after output; aborted: client left."""


@dataclass(frozen=True)
class UsageQuantities:
    """What a request consumed, in billable units."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    requests: int = 1
    web_searches: int = 0
    code_seconds: float = 0.0
    images: int = 0
    audio_seconds: float = 0.0
    video_seconds: float = 0.0


@dataclass(frozen=True)
class PriceApplied:
    """The catalog price in force when the request ran (unit prices before scaling)."""

    currency: str
    pricing_mode: str
    input_per_mtok: float
    output_per_mtok: float
    per_image: float | None = None
    per_audio_second: float | None = None
    spot_multiplier: float | None = None
    per_video_second: float | None = None
    batch_discount: float | None = None
    """Set on a batch line's record: the factor its cost was multiplied by."""


@dataclass(frozen=True)
class UsageRecord:
    """A row of the usage ledger (table ``usage_records``)."""

    request_id: str
    created_at: datetime
    user_id: str
    key_id: str
    org_id: str
    model: str
    route: str
    status: UsageStatus
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    reasoning_tokens: int | None
    requests: int
    web_searches: int
    code_seconds: float
    images: int
    audio_seconds: float
    currency: str
    pricing_mode: str
    input_per_mtok: float
    output_per_mtok: float
    per_image: float | None
    per_audio_second: float | None
    spot_multiplier: float | None
    cost: float
    # Added with video jobs (migration 4); defaults keep older spool lines readable.
    video_seconds: float = 0.0
    per_video_second: float | None = None
    # Added with batches (migration 7): the batch a line ran for, and the discount applied.
    batch_id: str | None = None
    batch_discount: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_row(self) -> dict[str, Any]:
        # Shallow on purpose: every field is a scalar, and ``asdict``'s recursive
        # deep copy was the largest single cost of a request in bench/gateway_cpu.py.
        return {f.name: getattr(self, f.name) for f in _FIELDS}

    def to_json(self) -> dict[str, Any]:
        row = self.to_row()
        row["created_at"] = self.created_at.isoformat()
        return row

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UsageRecord:
        values = dict(data)
        values["created_at"] = datetime.fromisoformat(values["created_at"])
        return cls(**values)


_FIELDS = dataclasses.fields(UsageRecord)
