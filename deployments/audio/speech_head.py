"""The speech head: one Ray Serve deployment per speech model of the catalog.

``SpeechHeadCore`` holds the head's rules (voice check, emotion tags removed
for engines that cannot perform them, conversion to the API's WAV) as plain
async Python, so the gateway's tests run it in-process; ``SpeechHead`` is the
thin Ray Serve wrapper. Synthesis and encoding run in worker threads (the
engine contract), so a replica keeps serving health checks and queues further
requests while a long text is spoken.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray import serve

from deployments.audio.base import SpeechEngine, SpeechEngineInfo, strip_emotion_tags
from deployments.engine_head import EngineHead, answer_as_value
from deployments.replica_logging import configure_replica_logging
from serve_app.contract.audio import (
    SPEC_VOICES,
    SpeechHeadReply,
    SpeechHeadRequest,
    SpeechHeadResult,
)
from serve_app.contract.errors import (
    InvalidRequestError,
    ModelUnavailableError,
)

logger = logging.getLogger(__name__)


class SpeechHeadCore:
    """Validation and WAV encoding around one ``SpeechEngine``."""

    def __init__(self, engine: SpeechEngine) -> None:
        self.engine = engine
        self.info: SpeechEngineInfo | None = None

    async def start(self) -> SpeechEngineInfo:
        info = await self.engine.start()
        missing = [v for v in SPEC_VOICES if v not in info.voices]
        if missing:
            raise RuntimeError(f"speech engine maps no voice for {', '.join(missing)}")
        self.info = info
        return info

    async def synthesize(self, request: SpeechHeadRequest) -> SpeechHeadReply:
        """The WAV for ``request``, or a ``HeadFailure`` carrying the API's status."""
        return await answer_as_value("speech", request.request_id, self._synthesize(request))

    async def _synthesize(self, request: SpeechHeadRequest) -> SpeechHeadResult:
        from deployments.audio.audio_io import to_wire_wav

        info = self.info
        if info is None:
            raise ModelUnavailableError("The speech head is still starting.", code="model_warming")
        if request.voice not in info.voices:
            raise InvalidRequestError(
                f"Unknown voice '{request.voice}'; use one of {', '.join(info.voices)}.",
                code="invalid_value",
                param="voice",
            )
        text = request.text if info.emotion_tags else strip_emotion_tags(request.text)
        if not text.strip():
            raise InvalidRequestError(
                "The input has no speakable text once emotion tags are removed.",
                code="invalid_value",
                param="input",
            )
        audio = await self.engine.synthesize(text, request.voice)
        if audio.samples.size == 0:  # e.g. Piper on bare punctuation: nothing to pronounce
            raise InvalidRequestError(
                "The input has no pronounceable text; the model produced no audio.",
                code="invalid_value",
                param="input",
            )
        wav, seconds = await asyncio.to_thread(to_wire_wav, audio.samples, audio.sample_rate)
        return SpeechHeadResult(wav=wav, seconds=seconds, voice=info.voices[request.voice])


@serve.deployment(ray_actor_options={"num_cpus": 0.5})
class SpeechHead(EngineHead):
    """Ray Serve replica hosting one speech engine; the engine comes from a factory."""

    core: SpeechHeadCore

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits async constructors
        self, model_id: str, backend: str, engine_config: dict[str, Any]
    ) -> None:
        configure_replica_logging()
        from deployments.audio.factory import build_speech_engine

        self.model_id = model_id
        self.core = SpeechHeadCore(build_speech_engine(backend, engine_config))
        info = await self.core.start()
        logger.info("speech head %s ready (%d Hz source)", model_id, info.sample_rate)

    async def synthesize(self, request: SpeechHeadRequest) -> SpeechHeadReply:
        return await self.core.synthesize(request)
