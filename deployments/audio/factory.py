"""Build speech and transcription engines from a backend name and a plain config dict.

The audio heads receive their engine from here, as the chat head does from
``deployments.chat.factory``: a catalog entry's ``engine.backend`` picks the
implementation (``deployments.registry`` names them, with their config classes and
runtimes), tests register scripted backends by name or name a ``module:Class``, and
no head knows which model runtime it hosts. Engine modules import their runtime
lazily, so a CPU box never imports vLLM or SNAC and the gateway imports none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deployments import registry
from deployments.audio.base import SpeechEngine, TranscriptionEngine

SpeechBuilder = Callable[[dict[str, Any]], SpeechEngine]
TranscriptionBuilder = Callable[[dict[str, Any]], TranscriptionEngine]


def register_speech_backend(name: str, builder: SpeechBuilder) -> None:
    registry.register("speech", name, builder)


def register_transcription_backend(name: str, builder: TranscriptionBuilder) -> None:
    registry.register("transcription", name, builder)


def build_speech_engine(backend: str, config: dict[str, Any]) -> SpeechEngine:
    """Construct (not start) the speech engine ``backend`` names."""
    engine: SpeechEngine = registry.build("speech", backend, SpeechEngine, config)
    return engine


def build_transcription_engine(backend: str, config: dict[str, Any]) -> TranscriptionEngine:
    """Construct (not start) the transcription engine ``backend`` names."""
    engine: TranscriptionEngine = registry.build(
        "transcription", backend, TranscriptionEngine, config
    )
    return engine
