"""What the gateway and the video heads agree on: the API's bounds, a job's request,
and the job and object store operations a head's worker performs.

A video job crosses no DeploymentHandle: the gateway writes it to the database
and a head's worker claims it there (``deployments.video.head``). Both sides
still share the API's bounds (the gateway validates against them, engines are
configured within them), ``round_num_frames`` (the gateway stores the rounded
count), and ``VideoRequest`` (what a stored job asks for).

The worker reaches the database and the object store only through the
``VideoJobStore`` and ``VideoObjectStore`` protocols below: the gateway's
composition root (``serve_app.builders``) hands the head a ``VideoStoresFactory``
that opens the concrete stores inside the head's replica, so ``deployments``
never imports the gateway's storage code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

MAX_WIDTH = 704
MAX_HEIGHT = 480
MAX_NUM_FRAMES = 161
MAX_INFERENCE_STEPS = 50
MIN_FPS, MAX_FPS = 8, 30
FRAME_BLOCK = 8
"""docs/reference/video.md#create-a-job: ``num_frames`` is a multiple of 8 plus 1 (LTX-Video's
latent frames)."""


def round_num_frames(requested: int) -> int:
    """The nearest ``8k + 1`` to ``requested``, halves rounded up, within 1..161.

    Nearest (not always up) so that a value already close to a valid count
    changes the least; 161 is itself ``8 * 20 + 1``, so no accepted request is
    ever rounded above the API's maximum (docs/reference/video.md#create-a-job).
    """
    k = math.floor((max(1, requested) - 1) / FRAME_BLOCK + 0.5)
    return min(MAX_NUM_FRAMES, FRAME_BLOCK * k + 1)


@dataclass(frozen=True)
class VideoRequest:
    """A job's parameters as the caller gave them (``None``: omitted)."""

    prompt: str
    negative_prompt: str | None
    seed: int
    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    num_inference_steps: int | None = None


class VideoJobView(Protocol):
    """What the worker reads of a claimed job (the gateway's ``VideoJob`` row)."""

    @property
    def id(self) -> str: ...

    def request(self) -> VideoRequest: ...


JobT = TypeVar("JobT", bound=VideoJobView)


class VideoJobStore(Protocol[JobT]):
    """The conditional job transitions a head's worker performs.

    Each call changes the job only while it is in the state the call expects
    (``serve_app.jobs.store.JobStore`` states the rules), so any number of
    workers and gateway replicas can act at once. The job type is generic: the
    worker hands ``complete`` back the very job ``claim_next`` gave it.
    """

    def claim_next(self, model: str, worker: str) -> JobT | None: ...

    def heartbeat(self, job_id: str, worker: str) -> bool: ...

    def complete(
        self,
        job: JobT,
        worker: str,
        object_key: str,
        seconds: float,
        gen_seconds: float,
        stored_bytes: int | None = None,
    ) -> bool:
        """``stored_bytes``: the uploaded file's size, counted in the organization's storage."""
        ...

    def fail(self, job_id: str, worker: str, message: str) -> bool: ...

    def release(self, job_id: str, worker: str) -> bool: ...

    def fail_stale(self, stale_after_s: float, *, model: str | None = None) -> int: ...


class VideoObjectStore(Protocol):
    """Where the worker uploads a finished video (and removes an orphaned upload)."""

    def put(self, key: str, data: bytes, content_type: str) -> None: ...

    def delete(self, key: str) -> None: ...


VideoStoresFactory = Callable[[], tuple[VideoJobStore[Any], VideoObjectStore]]
"""Opens a head replica's job store and object store (blocking: database migration
included); it must pickle, as it travels to the replica with the deployment's
arguments."""
