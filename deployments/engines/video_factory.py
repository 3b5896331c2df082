"""Build video engines from a backend name and a plain config dict.

The video head receives its engine from here, as the audio heads do from
``audio_factory``: a catalog entry's ``engine.backend`` picks the
implementation (``wan`` on CPU, ``ltx`` on a GPU), tests register scripted
backends or name a ``module:Class``. Builders import diffusers lazily, so the
gateway never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deployments.engines.backends import resolve_backend
from deployments.engines.video_base import VideoEngine

VideoBuilder = Callable[[dict[str, Any]], VideoEngine]


def _build_wan(config: dict[str, Any]) -> VideoEngine:
    from deployments.engines.diffusers_video import DiffusersVideoConfig, WanVideoEngine

    return WanVideoEngine(DiffusersVideoConfig.model_validate(config))


def _build_ltx(config: dict[str, Any]) -> VideoEngine:
    from deployments.engines.diffusers_video import LtxVideoConfig, LtxVideoEngine

    return LtxVideoEngine(LtxVideoConfig.model_validate(config))


VIDEO_BACKENDS: dict[str, VideoBuilder] = {"wan": _build_wan, "ltx": _build_ltx}


def register_video_backend(name: str, builder: VideoBuilder) -> None:
    VIDEO_BACKENDS[name] = builder


def is_known_video_backend(backend: str) -> bool:
    """Whether ``backend`` can serve a video model (checked when the app is built)."""
    return backend in VIDEO_BACKENDS or ":" in backend


def build_video_engine(backend: str, config: dict[str, Any]) -> VideoEngine:
    """Construct (not start) the video engine ``backend`` names."""
    builder = resolve_backend(backend, VideoEngine, VIDEO_BACKENDS)
    return builder(dict(config))
