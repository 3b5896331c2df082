"""The text-to-video engine contract shared by every video head backend.

A video head (``deployments.video.head``) owns one engine that it receives from
``deployments.registry.build_engine``, never constructs itself: diffusers'
``WanPipeline`` on a tiny random-weight model on CPU (the embedded default),
``LTXPipeline`` on Lightricks/LTX-Video on a GPU in production, a scripted
engine in tests of the job machinery.

Contract (read this before writing a backend):

1. ``start`` loads the model once, before the head reports healthy, and returns
   ``VideoEngineInfo``: the defaults for omitted request fields, the largest
   work the backend accepts, and the block sizes its latent space needs.
2. ``generate`` is ``async`` and must never block the event loop: the model
   runs in a worker thread, so the replica keeps heart-beating its job and
   answering health checks during a minutes-long generation.
3. ``generate`` receives parameters already resolved by ``resolve_params``
   (defaults filled, clamped to the engine's limits, sizes on its blocks).
4. Cancellation is cooperative: between diffusion steps the engine calls
   ``should_stop()`` and raises ``GenerationCancelled`` when it returns True.
   The head sets it when the job was cancelled (or taken away) in the database.
5. The result is RGB ``uint8`` frames ``(frames, height, width, 3)``; the head
   encodes the MP4, so engines never deal with containers.
6. Caller mistakes raise ``InvalidRequestError``; anything else raises and the
   head marks the job failed with the error's text.

The API's bounds, ``round_num_frames`` and ``VideoRequest`` (which the gateway
needs as well) live in ``serve_app.contract.video``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serve_app.contract.video import (
    FRAME_BLOCK,
    MAX_HEIGHT,
    MAX_INFERENCE_STEPS,
    MAX_NUM_FRAMES,
    MAX_WIDTH,
    VideoRequest,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class GenerationCancelled(Exception):
    """Raised by an engine when ``should_stop()`` said the job is no longer wanted."""


@dataclass(frozen=True)
class VideoDefaults:
    """Values used for request fields the caller omitted."""

    width: int
    height: int
    num_frames: int
    fps: int
    num_inference_steps: int


@dataclass(frozen=True)
class VideoLimits:
    """The most work one job may ask of this backend (at most the API's bounds).

    A CPU backend sets these lower than the API's so a job at the API's maximum
    still finishes; larger requests are scaled down to fit (documented in
    docs/api.md), never refused, because the API accepts them
    (docs/reference/video.md#create-a-job).
    """

    max_width: int = MAX_WIDTH
    max_height: int = MAX_HEIGHT
    max_num_frames: int = MAX_NUM_FRAMES
    max_inference_steps: int = MAX_INFERENCE_STEPS


@dataclass(frozen=True)
class VideoEngineInfo:
    """What a loaded video model offers."""

    defaults: VideoDefaults
    limits: VideoLimits
    size_multiple: int
    """Width and height must be multiples of this (latent downscale x patch size)."""


@dataclass(frozen=True)
class VideoParams:
    """Parameters an engine runs with: every field resolved."""

    prompt: str
    negative_prompt: str | None
    seed: int
    width: int
    height: int
    num_frames: int
    fps: int
    num_inference_steps: int

    @property
    def seconds(self) -> float:
        """Duration of the video these parameters produce."""
        return round(self.num_frames / self.fps, 3)


@dataclass
class GeneratedVideo:
    """RGB frames ``(frames, height, width, 3)`` as ``uint8``, to play at ``fps``."""

    frames: npt.NDArray[np.uint8]
    fps: int


def _on_block(value: int, multiple: int) -> int:
    """``value`` rounded down to a multiple of ``multiple``, at least one block."""
    return max(multiple, value // multiple * multiple)


def resolve_params(request: VideoRequest, info: VideoEngineInfo) -> VideoParams:
    """Fill defaults, scale the size down into the engine's limits, snap to its blocks.

    Width and height are scaled by one factor so the aspect ratio survives a
    clamp; frames keep the ``8k + 1`` form when clamped.
    """
    defaults, limits = info.defaults, info.limits
    width = request.width or defaults.width
    height = request.height or defaults.height
    scale = min(1.0, limits.max_width / width, limits.max_height / height)
    width = _on_block(int(width * scale), info.size_multiple)
    height = _on_block(int(height * scale), info.size_multiple)
    frames = request.num_frames or defaults.num_frames
    if frames > limits.max_num_frames:  # the largest 8k + 1 within the limit
        frames = (limits.max_num_frames - 1) // FRAME_BLOCK * FRAME_BLOCK + 1
    steps = request.num_inference_steps or defaults.num_inference_steps
    return VideoParams(
        prompt=request.prompt,
        negative_prompt=request.negative_prompt,
        seed=request.seed,
        width=width,
        height=height,
        num_frames=max(1, frames),
        fps=request.fps or defaults.fps,
        num_inference_steps=max(1, min(steps, limits.max_inference_steps)),
    )


StopCheck = Callable[[], bool]


class VideoEngine(abc.ABC):
    """A text-to-video model bound to one loaded checkpoint."""

    @abc.abstractmethod
    async def start(self) -> VideoEngineInfo:
        """Load the model; called once by the head before it reports healthy."""

    @abc.abstractmethod
    async def generate(self, params: VideoParams, should_stop: StopCheck) -> GeneratedVideo:
        """Render ``params``; raise ``GenerationCancelled`` once ``should_stop()`` is True."""

    async def check_health(self) -> None:
        """Raise when the engine can no longer serve."""
        return None

    async def shutdown(self) -> None:
        """Release the model; called when the replica stops."""
        return None
