"""Values exchanged between the gateway and the speech/transcription heads over a handle.

Plain dataclasses of builtins only (bytes, str, float), so a head can run in
another process or node, or in-process in tests. A head answers every call
with its result or one ``HeadFailure`` (never by raising), so a caller mistake
found inside the head (a corrupt file, an unknown voice) keeps its 400 instead
of arriving as Ray's generic task error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deployments.engines.audio_base import TranscriptSegment
from serve_app.contract.errors import HeadFailure


@dataclass
class SpeechHeadRequest:
    """Text to speak; ``text`` is the caller's input (tags included, at most 4096 chars)."""

    request_id: str
    text: str
    voice: str


@dataclass
class SpeechHeadResult:
    """The finished WAV (24 kHz mono 16-bit) and its duration."""

    wav: bytes
    seconds: float
    voice: str
    """The backend voice that rendered the spec voice."""


@dataclass
class TranscriptionHeadRequest:
    """An uploaded file as sniffed by the gateway, with the optional request fields."""

    request_id: str
    data: bytes
    container: str
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None


@dataclass
class TranscriptionHeadResult:
    text: str
    seconds: float
    """Duration of the decoded audio (billed per second)."""
    language: str | None = None
    segments: list[TranscriptSegment] = field(default_factory=list)


SpeechHeadReply = SpeechHeadResult | HeadFailure
TranscriptionHeadReply = TranscriptionHeadResult | HeadFailure
