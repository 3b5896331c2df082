"""The transcription head: one Ray Serve deployment per transcription model.

``TranscriptionHeadCore`` decodes the uploaded file with a real decoder (PyAV,
forced to the container the bytes announce), resamples it to what the engine
expects, and transcribes; all blocking work runs in worker threads so a replica
serves concurrent requests. ``TranscriptionHead`` is the thin Ray Serve wrapper.
Decoding lives here, not in the gateway: it is CPU work that belongs next to
the model, and the compressed upload is the smallest thing to ship to a head.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray import serve

from deployments.audio.base import (
    TranscriptionEngine,
    TranscriptionEngineInfo,
    TranscriptionOptions,
)
from deployments.engine_head import EngineHead, answer_as_value
from serve_app.contract.audio import (
    TranscriptionHeadReply,
    TranscriptionHeadRequest,
    TranscriptionHeadResult,
    sniff_container,
)
from serve_app.contract.errors import (
    ModelUnavailableError,
)

DEFAULT_MAX_AUDIO_SECONDS = 4 * 3600.0
"""Longest decoded audio a head accepts: bounds memory when a small file expands."""


class TranscriptionHeadCore:
    """Decoding and engine calls for one ``TranscriptionEngine``."""

    def __init__(
        self, engine: TranscriptionEngine, max_audio_seconds: float = DEFAULT_MAX_AUDIO_SECONDS
    ) -> None:
        self.engine = engine
        self.max_audio_seconds = max_audio_seconds
        self.info: TranscriptionEngineInfo | None = None

    async def start(self) -> TranscriptionEngineInfo:
        self.info = await self.engine.start()
        return self.info

    async def transcribe(self, request: TranscriptionHeadRequest) -> TranscriptionHeadReply:
        """The transcript, or a ``HeadFailure`` (400 ``invalid_audio`` for bad files)."""
        return await answer_as_value("transcription", request.request_id, self._transcribe(request))

    async def _transcribe(self, request: TranscriptionHeadRequest) -> TranscriptionHeadResult:
        from deployments.audio.audio_io import decode_audio, invalid_audio

        info = self.info
        if info is None:
            raise ModelUnavailableError("The head is still starting.", code="model_warming")
        container = sniff_container(request.data[:64])
        if container is None or container != request.container:
            raise invalid_audio("its content is not WAV, MP3, M4A, FLAC or OGG")
        samples = await asyncio.to_thread(
            decode_audio, request.data, container, info.sample_rate, self.max_audio_seconds
        )
        options = TranscriptionOptions(
            language=request.language, prompt=request.prompt, temperature=request.temperature
        )
        transcript = await self.engine.transcribe(samples, options)
        return TranscriptionHeadResult(
            text=transcript.text,
            seconds=samples.size / info.sample_rate,
            language=transcript.language,
            segments=transcript.segments,
        )


@serve.deployment(ray_actor_options={"num_cpus": 0.5})
class TranscriptionHead(EngineHead):
    """Ray Serve replica hosting one transcription engine, built by the backend registry."""

    kind = "transcription"
    core: TranscriptionHeadCore

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits async constructors
        self,
        model_id: str,
        backend: str,
        engine_config: dict[str, Any],
        max_audio_seconds: float = DEFAULT_MAX_AUDIO_SECONDS,
    ) -> None:
        await self.start_engine(
            model_id,
            backend,
            engine_config,
            lambda engine: TranscriptionHeadCore(engine, max_audio_seconds),
        )

    async def transcribe(self, request: TranscriptionHeadRequest) -> TranscriptionHeadReply:
        return await self.core.transcribe(request)
