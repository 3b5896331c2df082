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

from ray import serve

from deployments.audio.base import SpeechEngine, SpeechEngineInfo, strip_emotion_tags
from deployments.engine_head import EngineHead, answer_as_value
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
    """Ray Serve replica hosting one speech engine, built by the backend registry."""

    kind = "speech"
    core_class = SpeechHeadCore
    core: SpeechHeadCore

    async def synthesize(self, request: SpeechHeadRequest) -> SpeechHeadReply:
        return await self.core.synthesize(request)
