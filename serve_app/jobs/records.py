"""A video job as stored (one ``video_jobs`` row), its id format and its billing record.

Plain values only: the gateway, the video head's worker and the tests share
this module, and a job crosses no process boundary except as a database row.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from serve_app.billing.pricing import build_record
from serve_app.billing.records import UsageQuantities, UsageRecord
from serve_app.catalog.config import PricingConfig
from serve_app.contract.video import VideoRequest

QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED = (
    "queued",
    "running",
    "completed",
    "failed",
    "cancelled",
)
UNFINISHED = (QUEUED, RUNNING)
"""Non-terminal statuses: they count against the per-user cap (docs/reference/video.md#statuses,
docs/reference/common.md#limits)."""

JOB_ID_PREFIX = "vgen_"
_JOB_ID = re.compile(r"^vgen_[0-9a-f]{24}$")
USAGE_ROUTE = "video"


def new_job_id() -> str:
    """``vgen_`` + 96 random bits: unguessable, so ids leak nothing about other jobs."""
    return JOB_ID_PREFIX + secrets.token_hex(12)


def valid_job_id(value: str) -> bool:
    """Whether ``value`` has the shape of a job id (anything else is a 404 at once)."""
    return _JOB_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class JobOwner:
    """Whose jobs a caller sees: the user *in the organization the job was made in*.

    One user may hold keys in several organizations; a job made under one
    organization's key is that organization's (it is billed there), so the same user
    calling with another organization's key finds it missing (docs/api.md#tenant-isolation).
    """

    user_id: str
    org_id: str


def _aware(value: Any) -> Any:
    """SQLite returns naive datetimes; every stored time is UTC."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


@dataclass(frozen=True)
class VideoJob:
    """One row of ``video_jobs``."""

    id: str
    user_id: str
    key_id: str
    org_id: str
    model: str
    status: str
    prompt: str
    negative_prompt: str | None
    width: int | None
    height: int | None
    num_frames: int | None
    fps: int | None
    num_inference_steps: int | None
    seed: int
    pricing: str
    created_at: datetime
    worker: str | None = None
    error: str | None = None
    object_key: str | None = None
    seconds: float | None = None
    gen_seconds: float | None = None
    started_at: datetime | None = None
    heartbeat_at: datetime | None = None
    finished_at: datetime | None = None
    bytes: int | None = None

    @classmethod
    def from_row(cls, row: Any) -> VideoJob:
        values = {k: _aware(v) for k, v in dict(row).items()}
        return cls(**values)

    def to_row(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def unfinished(self) -> bool:
        return self.status in UNFINISHED

    def request(self) -> VideoRequest:
        """The parameters the caller asked for (``None`` where omitted)."""
        return VideoRequest(
            prompt=self.prompt,
            negative_prompt=self.negative_prompt,
            seed=self.seed,
            width=self.width,
            height=self.height,
            num_frames=self.num_frames,
            fps=self.fps,
            num_inference_steps=self.num_inference_steps,
        )


def usage_record(job: VideoJob, seconds: float, at: datetime) -> UsageRecord:
    """The ledger row of a completed job: its seconds of video at the price of its creation.

    ``request_id`` is the job id, so the record is unique per job even if a
    completion were ever replayed (the ledger inserts or ignores).
    """
    return build_record(
        request_id=job.id,
        created_at=at,
        user_id=job.user_id,
        key_id=job.key_id,
        org_id=job.org_id,
        model=job.model,
        route=USAGE_ROUTE,
        status="ok",
        usage=UsageQuantities(video_seconds=seconds),
        pricing=PricingConfig.model_validate_json(job.pricing),
    )
