"""Wire formats of ``POST /v1/audio/speech`` and ``POST /v1/audio/transcriptions``
(docs/reference/audio.md, docs/reference/common.md#limits).

Speech takes JSON and answers WAV bytes; transcription takes multipart form
data (its fields are declared on the route, as FastAPI reads forms) and answers
``{text, usage: {type: "duration", seconds}}``. Unknown speech fields are
accepted and named in ``x-service-ignored-params`` rather than refused, as
OpenAI clients send optional fields (``speed``, ``instructions``) freely.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from serve_app.contract.audio import DEFAULT_VOICE, SPEC_VOICES

MAX_SPEECH_INPUT_CHARS = 4096
"""docs/reference/common.md#limits: speech ``input`` is at most 4096 characters (code points, tags
included)."""

MAX_TRANSCRIPTION_FILE_BYTES = 25 * 1024 * 1024
"""The "25 MB" of docs/reference/common.md#limits, read as 25 MiB (26,214,400 bytes) of file
content, multipart framing excluded: the larger reading, so no file a client sizes as 25 MB is
refused."""

SPEECH_FORMATS = ("wav",)
TRANSCRIPTION_FORMATS = ("json", "text", "verbose_json")


class SpeechRequest(BaseModel):
    """Request body of ``POST /v1/audio/speech``."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, description="A speech model of the catalog.")
    input: str = Field(
        min_length=1,
        max_length=MAX_SPEECH_INPUT_CHARS,
        description="Text to speak; inline emotion tags such as <laugh> and <sigh> are "
        "performed by models that support them and removed by the others.",
    )
    voice: str | None = Field(
        default=None,
        description=f"One of {', '.join(SPEC_VOICES)}; omitted or null: {DEFAULT_VOICE}.",
    )
    response_format: str | None = Field(
        default=None, description="Only 'wav' (the default): mono 24 kHz 16-bit PCM."
    )

    def extra_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


class TranscriptionUsage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: float = Field(description="Duration of the submitted audio in seconds.")


class Transcription(BaseModel):
    """200 body of ``POST /v1/audio/transcriptions`` (``response_format=json``)."""

    text: str
    usage: TranscriptionUsage


class TranscriptionSegment(BaseModel):
    """A timed piece of the transcript (OpenAI's ``verbose_json`` segment)."""

    id: int
    seek: int
    start: float = Field(description="Seconds from the start of the audio.")
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


class TranscriptionVerbose(BaseModel):
    """200 body with ``response_format=verbose_json``: the text with language and timing."""

    task: Literal["transcribe"] = "transcribe"
    language: str = Field(description="Spoken language as the model detected or was told.")
    duration: float = Field(description="Duration of the submitted audio in seconds.")
    text: str
    segments: list[TranscriptionSegment]
    usage: TranscriptionUsage
