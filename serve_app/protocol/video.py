"""Wire formats of the video generation routes (docs/reference/video.md,
docs/reference/common.md#limits).

Every bound of docs/reference/video.md#create-a-job is enforced
here, so a violation is a 400 ``invalid_value`` naming the field before anything else runs. Numbers
are strict integers: ``"64"``, ``64.5`` and ``true`` are refused rather than
coerced, as a job would otherwise run with a value the caller did not write;
``64.0`` is the integer 64 (JSON Schema's reading, so the published schema and
the server agree). Omitted (or null) sizes are filled by the model's head from its own
defaults. Unknown fields are accepted and named in ``x-service-ignored-params``
like on the other non-chat routes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from serve_app.contract.video import (
    MAX_FPS,
    MAX_HEIGHT,
    MAX_INFERENCE_STEPS,
    MAX_NUM_FRAMES,
    MAX_WIDTH,
    MIN_FPS,
)
from serve_app.protocol.common import WholeInt

MAX_PROMPT_CHARS = 2000
"""docs/reference/common.md#limits: the video prompt is at most 2000 characters (Unicode code
points)."""
MAX_SEED = 2**63 - 1


def _bounded(low: int, high: int) -> object:
    """A strict integer in ``low..high`` (no strings, fractions or booleans)."""
    return Field(strict=True, ge=low, le=high)


Fps = Annotated[WholeInt, _bounded(MIN_FPS, MAX_FPS)]
Width = Annotated[WholeInt, _bounded(1, MAX_WIDTH)]
Height = Annotated[WholeInt, _bounded(1, MAX_HEIGHT)]
NumFrames = Annotated[WholeInt, _bounded(1, MAX_NUM_FRAMES)]
Steps = Annotated[WholeInt, _bounded(1, MAX_INFERENCE_STEPS)]
Seed = Annotated[WholeInt, _bounded(0, MAX_SEED)]
# Published patterns of the two validators below: something besides whitespace, no NUL.
_NOT_BLANK = {"pattern": r"^[^\x00]*[^\x00\s][^\x00]*$"}
_NO_NUL = {"pattern": r"^[^\x00]*$"}
Prompt = Annotated[
    str,
    Field(strict=True, min_length=1, max_length=MAX_PROMPT_CHARS, json_schema_extra=_NOT_BLANK),
]
NegativePrompt = Annotated[
    str, Field(strict=True, max_length=MAX_PROMPT_CHARS, json_schema_extra=_NO_NUL)
]


class VideoGenerationRequest(BaseModel):
    """Request body of ``POST /v1/video/generations``."""

    model_config = ConfigDict(extra="allow")

    model: Annotated[str, Field(strict=True, min_length=1, max_length=256)] = Field(
        description="A video model of the catalog."
    )
    prompt: Prompt = Field(description="What to show; at most 2000 characters.")
    negative_prompt: NegativePrompt | None = Field(
        default=None, description="What to avoid; at most 2000 characters."
    )
    fps: Fps | None = Field(default=None, description="Frames per second, 8..30.")
    width: Width | None = Field(default=None, description="Pixels, at most 704.")
    height: Height | None = Field(default=None, description="Pixels, at most 480.")
    num_frames: NumFrames | None = Field(
        default=None, description="At most 161; rounded to the nearest multiple of 8 plus 1."
    )
    num_inference_steps: Steps | None = Field(
        default=None, description="Denoising steps, at most 50."
    )
    seed: Seed | None = Field(
        default=None,
        description="0..2^63-1; omitted: a random seed (the job is reproducible with it).",
    )

    @field_validator("prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the prompt is empty")
        return value

    @field_validator("prompt", "negative_prompt")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        # PostgreSQL text cannot hold NUL; refuse it here rather than fail at the insert.
        if value is not None and "\x00" in value:
            raise ValueError("NUL characters are not allowed")
        return value

    def extra_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


VideoStatus = Literal["queued", "running", "completed", "failed", "cancelled"]


class VideoJobError(BaseModel):
    message: str


class VideoResult(BaseModel):
    """Where the finished video is, for how long it plays, how long it took."""

    url: str = Field(description="Presigned URL, resolved afresh on every read; it expires.")
    seconds: float = Field(description="Duration of the video: frames / fps.")
    gen_seconds: float = Field(description="Wall time the worker spent generating it.")


class VideoGenerationJob(BaseModel):
    """docs/reference/video.md#job. ``error`` only on failed jobs, ``video`` only on completed
    ones."""

    id: str = Field(description="Begins with vgen_.")
    object: Literal["video.generation"] = "video.generation"
    model: str
    created: int = Field(description="Epoch seconds of creation.")
    status: VideoStatus
    error: VideoJobError | None = None
    video: VideoResult | None = None


class VideoGenerationJobList(BaseModel):
    """``GET /v1/video/generations``: the caller's most recent jobs, newest first."""

    object: Literal["list"] = "list"
    data: list[VideoGenerationJob]


class VideoGenerationDeleted(BaseModel):
    """``DELETE /v1/video/generations/{job_id}``: the job and its file are gone."""

    id: str
    object: Literal["video.generation.deleted"] = "video.generation.deleted"
    deleted: bool = True
