"""A scripted text-to-video engine for tests of the job machinery (no model).

It follows the engine contract of ``deployments.video.base``: the
render runs in a worker thread, checks ``should_stop`` between "steps" and
returns distinct ``uint8`` frames of the resolved size. ``hold`` keeps it at its
first step until the test calls ``release()`` (a job observably running, or
cancelled mid-render); ``fail`` raises with that message after the steps.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np

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

DEFAULTS = VideoDefaults(width=32, height=32, num_frames=9, fps=8, num_inference_steps=2)


class ScriptedVideoEngine(VideoEngine):
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.fail: str | None = config.get("fail")
        self.limits = VideoLimits(**config.get("limits", {}))
        self.size_multiple = int(config.get("size_multiple", 16))
        self.rendering = threading.Event()
        self._release = threading.Event()
        if not config.get("hold"):
            self._release.set()
        self.seen: list[VideoParams] = []

    def release(self) -> None:
        self._release.set()

    async def start(self) -> VideoEngineInfo:
        return VideoEngineInfo(
            defaults=DEFAULTS, limits=self.limits, size_multiple=self.size_multiple
        )

    async def generate(self, params: VideoParams, should_stop: StopCheck) -> GeneratedVideo:
        return await asyncio.to_thread(self._render, params, should_stop)

    def _render(self, params: VideoParams, should_stop: StopCheck) -> GeneratedVideo:
        self.seen.append(params)
        self.rendering.set()
        for _ in range(params.num_inference_steps):
            while not self._release.wait(0.01):
                if should_stop():
                    raise GenerationCancelled()
            if should_stop():
                raise GenerationCancelled()
        if self.fail:
            raise RuntimeError(self.fail)
        shape = (params.num_frames, params.height, params.width, 3)
        frames = np.zeros(shape, dtype=np.uint8)
        for index in range(params.num_frames):  # a brightness ramp: every frame differs
            frames[index] = (index * 255) // max(1, params.num_frames - 1)
        return GeneratedVideo(frames=frames, fps=params.fps)
