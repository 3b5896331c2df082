"""Text-to-video backends on diffusers pipelines: Wan (CPU default) and LTX-Video (GPU).

Both run the same code around a diffusers pipeline: load it once, render in a
worker thread with a seeded CPU generator (the same seed gives the same video
on any device), stop between denoising steps when the head says the job is no
longer wanted (``callback_on_step_end`` raising ``GenerationCancelled``), and
turn the pipeline's float frames into ``uint8`` RGB. The backends differ only
in the pipeline class, the block size of their latent space and a few call
arguments:

- ``wan``: ``WanPipeline``; on CPU it loads the tiny random-weight pipeline
  ``tiny:wan`` built by ``deployments.local_models.tiny_video_model`` (no hub).
- ``ltx``: ``LTXPipeline`` on ``Lightricks/LTX-Video`` in bfloat16 on CUDA.
  Sizes are multiples of 32, frames ``8k + 1`` (the API's form), up to
  704x480 and 161 frames. The real checkpoint needs a GPU and the hub (or a
  local copy); the tests run this same backend on CPU on ``tiny:ltx``, a tiny
  random-weight LTX pipeline with LTX-Video's compression ratios.

diffusers and torch are imported when the engine starts, never by the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from deployments.video.base import (
    GeneratedVideo,
    GenerationCancelled,
    StopCheck,
    VideoDefaults,
    VideoEngine,
    VideoEngineInfo,
    VideoLimits,
    VideoParams,
)
from serve_app.contract.video import (
    MAX_FPS,
    MAX_HEIGHT,
    MAX_INFERENCE_STEPS,
    MAX_NUM_FRAMES,
    MAX_WIDTH,
    MIN_FPS,
)

logger = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VideoDefaultsConfig(_Strict):
    """Values for request fields the caller omits."""

    width: int = Field(default=MAX_WIDTH, ge=1, le=MAX_WIDTH, description="Pixels.")
    height: int = Field(default=MAX_HEIGHT, ge=1, le=MAX_HEIGHT, description="Pixels.")
    num_frames: int = Field(
        default=121, ge=1, le=MAX_NUM_FRAMES, description="Frames; use the 8k+1 form."
    )
    fps: int = Field(default=24, ge=MIN_FPS, le=MAX_FPS, description="Frames per second.")
    num_inference_steps: int = Field(
        default=40, ge=1, le=MAX_INFERENCE_STEPS, description="Denoising steps."
    )


class VideoLimitsConfig(_Strict):
    """The most work one job may ask; larger requests are scaled down to fit."""

    max_width: int = Field(default=MAX_WIDTH, ge=1, le=MAX_WIDTH)
    max_height: int = Field(default=MAX_HEIGHT, ge=1, le=MAX_HEIGHT)
    max_num_frames: int = Field(default=MAX_NUM_FRAMES, ge=1, le=MAX_NUM_FRAMES)
    max_inference_steps: int = Field(default=MAX_INFERENCE_STEPS, ge=1, le=MAX_INFERENCE_STEPS)


class DiffusersVideoConfig(_Strict):
    """Settings shared by the diffusers video backends (``engine.config`` in the catalog)."""

    model: str = Field(description="Hub id, local folder, or tiny:wan (built locally).")
    models_dir: str | None = Field(
        default=None, description="Where tiny:<kind> models are built; default <state>/models."
    )
    device: str = Field(default="cpu", description="torch device: cpu or cuda.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Weights dtype (bfloat16 on GPUs)."
    )
    local_files_only: bool = Field(
        default=True, description="Never reach the model hub (false: download on first start)."
    )
    guidance_scale: float = Field(default=5.0, ge=0, description="Classifier-free guidance.")
    max_sequence_length: int = Field(default=128, ge=8, description="Prompt tokens kept.")
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads.")
    defaults: VideoDefaultsConfig = Field(default_factory=VideoDefaultsConfig)
    limits: VideoLimitsConfig = Field(default_factory=VideoLimitsConfig)


class LtxVideoConfig(DiffusersVideoConfig):
    """LTX-Video specifics (diffusers' recommended decode settings for 0.9.1+)."""

    decode_timestep: float = Field(default=0.05, ge=0)
    decode_noise_scale: float = Field(default=0.025, ge=0)
    vae_tiling: bool = Field(default=False, description="Decode in tiles to save GPU memory.")


def frames_to_uint8(frames: Any) -> Any:
    """Float frames in [0, 1] ``(n, h, w, 3)`` -> ``uint8``."""
    import numpy as np

    array = np.asarray(frames, dtype=np.float32)
    return (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


class DiffusersVideoEngine(VideoEngine):
    """The pipeline-running code both backends share; subclasses name the pipeline."""

    pipeline_class_name = ""

    def __init__(self, config: DiffusersVideoConfig) -> None:
        self.config = config
        self.pipeline: Any = None
        self._lock = threading.Lock()  # one generation at a time per loaded pipeline

    async def start(self) -> VideoEngineInfo:
        started = time.monotonic()
        self.pipeline = await asyncio.to_thread(self._load)
        logger.info(
            "%s loaded from %s on %s in %.1f s",
            self.pipeline_class_name,
            self.config.model,
            self.config.device,
            time.monotonic() - started,
        )
        d, lim = self.config.defaults, self.config.limits
        return VideoEngineInfo(
            defaults=VideoDefaults(**d.model_dump()),
            limits=VideoLimits(**lim.model_dump()),
            size_multiple=self.size_multiple(),
        )

    def _model_path(self) -> str:
        """The configured model; ``tiny:<kind>`` is built locally on first use."""
        from deployments.local_models.resolve import resolve_model

        folder = Path(self.config.models_dir) if self.config.models_dir else None
        return resolve_model(self.config.model, folder)

    def _load(self) -> Any:
        import diffusers
        import torch

        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        pipeline_class = getattr(diffusers, self.pipeline_class_name)
        pipeline = pipeline_class.from_pretrained(
            self._model_path(),
            dtype=getattr(torch, self.config.dtype),
            local_files_only=self.config.local_files_only,
        )
        pipeline.set_progress_bar_config(disable=True)
        return pipeline.to(self.config.device)

    def size_multiple(self) -> int:
        raise NotImplementedError

    def call_kwargs(self, params: VideoParams) -> dict[str, Any]:
        """Backend-specific pipeline arguments beyond the shared ones."""
        return {}

    async def generate(self, params: VideoParams, should_stop: StopCheck) -> GeneratedVideo:
        frames = await asyncio.to_thread(self._render, params, should_stop)
        return GeneratedVideo(frames=frames, fps=params.fps)

    def _render(self, params: VideoParams, should_stop: StopCheck) -> Any:
        import torch

        if self.pipeline is None:
            raise RuntimeError("the video engine was not started")
        if should_stop():
            raise GenerationCancelled()

        def on_step_end(
            _pipe: Any, step: int, _timestep: Any, tensors: dict[str, Any]
        ) -> dict[str, Any]:
            if should_stop():
                logger.info("generation stopped after step %d", step + 1)
                raise GenerationCancelled()
            return tensors

        generator = torch.Generator(device="cpu").manual_seed(params.seed)
        with self._lock, torch.inference_mode():
            output = self.pipeline(
                prompt=params.prompt,
                negative_prompt=params.negative_prompt,
                width=params.width,
                height=params.height,
                num_frames=params.num_frames,
                num_inference_steps=params.num_inference_steps,
                guidance_scale=self.config.guidance_scale,
                max_sequence_length=self.config.max_sequence_length,
                generator=generator,
                output_type="np",
                callback_on_step_end=on_step_end,
                **self.call_kwargs(params),
            )
        return frames_to_uint8(output.frames[0])

    async def shutdown(self) -> None:
        self.pipeline = None


class WanVideoEngine(DiffusersVideoEngine):
    """``WanPipeline``: the tiny local model on CPU, or a Wan 2.1 checkpoint."""

    pipeline_class_name = "WanPipeline"

    def size_multiple(self) -> int:
        pipe = self.pipeline
        return int(pipe.vae_scale_factor_spatial * pipe.transformer.config.patch_size[1])


class LtxVideoEngine(DiffusersVideoEngine):
    """``LTXPipeline`` on Lightricks/LTX-Video (GPU production backend)."""

    pipeline_class_name = "LTXPipeline"

    def __init__(self, config: LtxVideoConfig) -> None:
        super().__init__(config)
        self.ltx = config

    def _load(self) -> Any:
        pipeline = super()._load()
        if self.ltx.vae_tiling:
            pipeline.vae.enable_tiling()
        return pipeline

    def size_multiple(self) -> int:
        # LTXPipeline.check_inputs wants multiples of 32; the latent grid wants its patches.
        pipe = self.pipeline
        grid = int(pipe.vae_spatial_compression_ratio * pipe.transformer_spatial_patch_size)
        return math.lcm(32, grid)

    def call_kwargs(self, params: VideoParams) -> dict[str, Any]:
        return {
            "frame_rate": params.fps,
            "decode_timestep": self.ltx.decode_timestep,
            "decode_noise_scale": self.ltx.decode_noise_scale,
        }
