"""Build video engines from a backend name and a plain config dict.

The video head receives its engine from here, as the audio heads do from
``deployments.audio.factory``: a catalog entry's ``engine.backend`` picks the implementation
(``deployments.registry``: ``wan`` on CPU, ``ltx`` on a GPU), tests register scripted
backends or name a ``module:Class``. The engine module imports diffusers lazily, so
the gateway never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deployments import registry
from deployments.video.base import VideoEngine

VideoBuilder = Callable[[dict[str, Any]], VideoEngine]


def register_video_backend(name: str, builder: VideoBuilder) -> None:
    registry.register("video", name, builder)


def build_video_engine(backend: str, config: dict[str, Any]) -> VideoEngine:
    """Construct (not start) the video engine ``backend`` names."""
    engine: VideoEngine = registry.build("video", backend, VideoEngine, config)
    return engine
