"""Speech and transcription: validate, resolve, admit, call the head, answer.

Routes stay thin by handing the parsed request to ``AudioService``, which owns
the order of the checks: catalog (404/403/400) -> request rules (400, 413) ->
readiness (503) -> limits (429) -> head call (502/503, 504 on timeout) ->
usage record. Nothing here blocks the event loop: the upload is read from its
spooled temporary file in a thread and the heads do their work elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass, field

from serve_app.auth.principal import Principal
from serve_app.billing.records import UsageQuantities
from serve_app.catalog.catalog import Catalog
from serve_app.contract.audio import (
    DEFAULT_VOICE,
    SPEC_VOICES,
    SpeechHeadRequest,
    SpeechHeadResult,
    TranscriptionHeadRequest,
    TranscriptionHeadResult,
    sniff_container,
)
from serve_app.heads.client import SpeechClient, TranscriptionClient
from serve_app.inference.answers import Body
from serve_app.inference.ids import new_request_id
from serve_app.inference.metering import Metering, RequestMeta
from serve_app.inference.readiness import HeadReadiness
from serve_app.inference.unary_metering import estimate_tokens
from serve_app.inference.unary_service import UnaryHeadService
from serve_app.protocol.audio import (
    MAX_TRANSCRIPTION_FILE_BYTES,
    SPEECH_FORMATS,
    TRANSCRIPTION_FORMATS,
    SpeechRequest,
    Transcription,
    TranscriptionSegment,
    TranscriptionUsage,
    TranscriptionVerbose,
)
from serve_app.protocol.errors import InvalidRequestError, RequestTooLargeError
from serve_app.protocol.headers import ignored_params_header
from serve_app.protocol.uploads import Upload

logger = logging.getLogger(__name__)

_SNIFF_BYTES = 64


@dataclass(frozen=True)
class AudioPolicy:
    """Limits and timeouts of the audio routes (``GatewayAppArgs.audio``)."""

    speech_timeout_s: float = 300.0
    transcription_timeout_s: float = 300.0
    max_file_bytes: int = MAX_TRANSCRIPTION_FILE_BYTES
    multipart_overhead_bytes: int = 1024 * 1024
    """Body allowance beyond the file for multipart framing and the other fields."""


@dataclass
class TranscriptionForm:
    """The multipart fields of a transcription request, as the route read them."""

    model: str
    file: Upload | None
    response_format: str | None = None
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None
    ignored: list[str] = field(default_factory=list)


class AudioService(UnaryHeadService):
    """Serves ``/v1/audio/speech`` and ``/v1/audio/transcriptions`` for the catalog."""

    def __init__(
        self,
        catalog: Catalog,
        speech_heads: dict[str, SpeechClient],
        transcription_heads: dict[str, TranscriptionClient],
        readiness: HeadReadiness,
        policy: AudioPolicy,
        metering: Metering | None = None,
    ) -> None:
        super().__init__(catalog, readiness, metering)
        self.speech_heads = speech_heads
        self.transcription_heads = transcription_heads
        self.policy = policy

    async def speech(self, body: SpeechRequest, principal: Principal) -> Body:
        model = self.catalog.resolve(body.model, principal, "speech")
        voice = _check_speech(body)
        client = self._ready(self.speech_heads, model)
        request = SpeechHeadRequest(new_request_id("speech"), body.input, voice)
        meta = RequestMeta(principal, model, "speech", request.request_id, 1)
        prompt_tokens = estimate_tokens(body.input)
        result = await self._metered(
            meta,
            lambda: client.synthesize(request),
            self.policy.speech_timeout_s,
            SpeechHeadResult,
            lambda r: UsageQuantities(prompt_tokens=prompt_tokens, audio_seconds=r.seconds),
            reserve_tokens=prompt_tokens,
        )
        headers = {"x-service-voice": result.voice, **ignored_params_header(body.extra_fields())}
        return Body(result.wav, headers, media_type="audio/wav")

    async def transcription(self, form: TranscriptionForm, principal: Principal) -> Body:
        model = self.catalog.resolve(form.model, principal, "transcription")
        upload = form.file
        if upload is None:
            raise InvalidRequestError(
                "Missing required parameter: 'file'.",
                code="missing_required_parameter",
                param="file",
            )
        response_format = form.response_format or "json"
        if response_format not in TRANSCRIPTION_FORMATS:
            raise _unsupported_format(response_format, TRANSCRIPTION_FORMATS)
        container = await self._check_upload(upload)
        client = self._ready(self.transcription_heads, model)
        data = await upload.read()  # from the spooled file, in a thread once on disk
        request = TranscriptionHeadRequest(
            new_request_id("transcr"),
            data,
            container,
            language=form.language or None,
            prompt=form.prompt or None,
            temperature=form.temperature,
        )
        meta = RequestMeta(principal, model, "transcriptions", request.request_id, 1)
        result = await self._metered(
            meta,
            lambda: client.transcribe(request),
            self.policy.transcription_timeout_s,
            TranscriptionHeadResult,
            lambda r: UsageQuantities(
                completion_tokens=estimate_tokens(r.text), audio_seconds=r.seconds
            ),
        )
        headers = ignored_params_header(form.ignored)
        usage = TranscriptionUsage(seconds=result.seconds)
        if response_format == "text":
            return Body(result.text.encode(), headers, media_type="text/plain")
        if response_format == "verbose_json":
            verbose = TranscriptionVerbose(
                language=result.language or form.language or "",
                duration=result.seconds,
                text=result.text,
                segments=[TranscriptionSegment(**asdict(s)) for s in result.segments],
                usage=usage,
            )
            return Body.json(verbose.model_dump(), headers=headers)
        body = Transcription(text=result.text, usage=usage)
        return Body.json(body.model_dump(), headers=headers)

    async def _check_upload(self, upload: Upload) -> str:
        """docs/reference/common.md#limits: at most ``max_file_bytes`` (413) and a supported
        container by content (400)."""
        limit = self.policy.max_file_bytes
        size = upload.size
        if size is None:
            size = await asyncio.to_thread(_spooled_size, upload)
        if size > limit:
            raise RequestTooLargeError(
                f"The file is {size} bytes; the limit is {limit} bytes (25 MiB).", param="file"
            )
        await upload.seek(0)
        head = await upload.read(_SNIFF_BYTES)
        await upload.seek(0)
        container = sniff_container(head)
        if container is None:
            raise InvalidRequestError(
                "The file is not audio in a supported format (WAV, MP3, M4A, FLAC or OGG); "
                "the format is read from the content, not the name or content type.",
                code="invalid_audio",
                param="file",
            )
        return container


def _check_speech(body: SpeechRequest) -> str:
    """docs/reference/audio.md#speech rules the pydantic model cannot say; returns the normalized
    voice."""
    if not body.input.strip():
        raise InvalidRequestError(
            "input must contain text to speak.", code="invalid_value", param="input"
        )
    voice = DEFAULT_VOICE if body.voice is None else body.voice.strip().lower()
    if voice not in SPEC_VOICES:
        raise InvalidRequestError(
            f"Unknown voice '{body.voice}'; use one of {', '.join(SPEC_VOICES)}.",
            code="invalid_value",
            param="voice",
        )
    if body.response_format is not None and body.response_format not in SPEECH_FORMATS:
        raise _unsupported_format(body.response_format, SPEECH_FORMATS)
    return voice


def _unsupported_format(value: str, allowed: tuple[str, ...]) -> InvalidRequestError:
    return InvalidRequestError(
        f"response_format '{value}' is not supported; use {' or '.join(allowed)}.",
        code="unsupported_value",
        param="response_format",
    )


def _spooled_size(upload: Upload) -> int:
    upload.file.seek(0, 2)
    return int(upload.file.tell())
