"""``POST /v1/audio/speech`` (docs/reference/audio.md#speech) and ``POST /v1/audio/transcriptions``
(docs/reference/audio.md#transcriptions).

The transcription body is multipart: the body-limit middleware counts it as it
streams (no buffering) against the file limit plus multipart framing, Starlette
spools the file to a temporary file (memory up to 1 MiB, then disk), and the
service checks the file's exact size.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, Response, UploadFile

from serve_app.inference.audio.service import AudioService, TranscriptionForm
from serve_app.protocol.audio import TRANSCRIPTION_FORMATS, SpeechRequest, Transcription
from serve_app.requests.deps import InferenceCaller, State
from serve_app.requests.openapi import ERROR_RESPONSES
from serve_app.routes.answers import http_response

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
STREAMED_PATHS = (TRANSCRIPTIONS_PATH,)
"""Bodies the middleware counts without buffering (the multipart parser spools them)."""

_FORM_FIELDS = frozenset({"file", "model", "response_format", "language", "prompt", "temperature"})

router = APIRouter(prefix="/v1", tags=["audio"])


def body_limits(service: AudioService) -> dict[str, int]:
    """Per-path body limits the audio routes need (file limit + multipart allowance)."""
    policy = service.policy
    return {TRANSCRIPTIONS_PATH: policy.max_file_bytes + policy.multipart_overhead_bytes}


@router.post(
    "/audio/speech",
    response_class=Response,
    responses={**ERROR_RESPONSES, 200: {"content": {"audio/wav": {}}}},
    summary="Speak text: WAV, mono, 24 kHz, 16-bit PCM",
)
async def create_speech(body: SpeechRequest, caller: InferenceCaller, state: State) -> Response:
    return http_response(await state.audio.speech(body, caller))


@router.post(
    "/audio/transcriptions",
    response_model=Transcription,
    responses={**ERROR_RESPONSES, 200: {"content": {"text/plain": {}}}},
    summary="Transcribe an audio file (WAV, MP3, M4A, FLAC or OGG; at most 25 MiB)",
)
async def create_transcription(
    request: Request,
    caller: InferenceCaller,
    state: State,
    file: Annotated[UploadFile, File(description="The audio file; format read from content.")],
    model: Annotated[str, Form(min_length=1, description="A transcription model.")],
    response_format: Annotated[
        str | None,
        Form(
            description="json (default), text or verbose_json.",
            json_schema_extra={"enum": list(TRANSCRIPTION_FORMATS)},
        ),
    ] = None,
    language: Annotated[str | None, Form(description="ISO-639-1 hint.")] = None,
    prompt: Annotated[str | None, Form(description="Text to guide the style.")] = None,
    temperature: Annotated[float | None, Form(ge=0, le=1)] = None,
) -> Response:
    form = await request.form()  # already parsed (and cached) by FastAPI
    ignored = sorted({name for name in form if name not in _FORM_FIELDS})
    answer = await state.audio.transcription(
        TranscriptionForm(
            model=model,
            file=file,
            response_format=response_format,
            language=language,
            prompt=prompt,
            temperature=temperature,
            ignored=ignored,
        ),
        caller,
    )
    return http_response(answer)
