"""Build speech and transcription engines from a backend name and a plain config dict.

The audio heads receive their engine from here, as the chat head does from
``deployments.engines.factory``: a catalog entry's ``engine.backend`` picks the
implementation, tests register scripted backends by name or name a
``module:Class``, and no head knows which model runtime it hosts. Each builder
validates its config with the backend's pydantic model and imports its runtime
lazily, so a CPU box never imports vLLM or SNAC and the gateway imports none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deployments.engines.audio_base import SpeechEngine, TranscriptionEngine
from deployments.engines.backends import resolve_backend

SpeechBuilder = Callable[[dict[str, Any]], SpeechEngine]
TranscriptionBuilder = Callable[[dict[str, Any]], TranscriptionEngine]


def _build_piper(config: dict[str, Any]) -> SpeechEngine:
    from deployments.engines.piper_engine import PiperConfig, PiperSpeechEngine

    return PiperSpeechEngine(PiperConfig.model_validate(config))


def _build_orpheus(config: dict[str, Any]) -> SpeechEngine:
    from deployments.engines.orpheus_engine import OrpheusConfig, OrpheusSpeechEngine

    return OrpheusSpeechEngine(OrpheusConfig.model_validate(config))


def _build_faster_whisper(config: dict[str, Any]) -> TranscriptionEngine:
    from deployments.engines.whisper_engine import FasterWhisperConfig, FasterWhisperEngine

    return FasterWhisperEngine(FasterWhisperConfig.model_validate(config))


SPEECH_BACKENDS: dict[str, SpeechBuilder] = {"piper": _build_piper, "orpheus": _build_orpheus}
TRANSCRIPTION_BACKENDS: dict[str, TranscriptionBuilder] = {"faster-whisper": _build_faster_whisper}


def register_speech_backend(name: str, builder: SpeechBuilder) -> None:
    SPEECH_BACKENDS[name] = builder


def register_transcription_backend(name: str, builder: TranscriptionBuilder) -> None:
    TRANSCRIPTION_BACKENDS[name] = builder


def is_known_backend(head: str, backend: str) -> bool:
    """Whether ``backend`` can serve a ``head`` model (checked when the app is built)."""
    registry: dict[str, Any] = SPEECH_BACKENDS if head == "speech" else TRANSCRIPTION_BACKENDS
    return backend in registry or ":" in backend


def build_speech_engine(backend: str, config: dict[str, Any]) -> SpeechEngine:
    """Construct (not start) the speech engine ``backend`` names."""
    builder = resolve_backend(backend, SpeechEngine, SPEECH_BACKENDS)
    return builder(dict(config))


def build_transcription_engine(backend: str, config: dict[str, Any]) -> TranscriptionEngine:
    """Construct (not start) the transcription engine ``backend`` names."""
    builder = resolve_backend(backend, TranscriptionEngine, TRANSCRIPTION_BACKENDS)
    return builder(dict(config))
