"""Values the gateway and the speech/transcription heads share, and exchange over a handle.

Plain dataclasses of builtins only (bytes, str, float), so a head can run in
another process or node, or in-process in tests. A head answers every call
with its result or one ``HeadFailure`` (never by raising), so a caller mistake
found inside the head (a corrupt file, an unknown voice) keeps its 400 instead
of arriving as Ray's generic task error.

The API's voice list and ``sniff_container`` are here too: the gateway
validates and sniffs a request before any head is asked, and the heads apply the
same rules, without either side loading numpy, PyAV or a model runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from serve_app.contract.errors import HeadFailure

SPEC_VOICES: tuple[str, ...] = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
"""The voices of docs/reference/audio.md#speech; every speech backend maps each of them to a real
voice."""

DEFAULT_VOICE = "tara"

AudioContainer = Literal["wav", "mp3", "mp4", "flac", "ogg"]
"""Containers of docs/reference/audio.md#transcriptions, named as FFmpeg's demuxers (``mp4`` covers
M4A)."""


def sniff_container(head: bytes) -> AudioContainer | None:
    """The container the first bytes of a file announce, or None.

    The declared content type and file name are never trusted
    (docs/reference/audio.md#transcriptions): the decoder is then forced to this container, so
    FFmpeg never probes other demuxers (playlists, image sequences) on caller-supplied bytes.
    """
    if len(head) >= 12 and head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"OggS"):
        return "ogg"
    if len(head) >= 12 and head[4:8] == b"ftyp":
        return "mp4"
    if head.startswith(b"ID3"):
        return "mp3"
    # An MPEG audio frame: 11 sync bits, then a layer other than "reserved" (ADTS AAC).
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and head[1] & 0x06:
        return "mp3"
    return None


@dataclass
class TranscriptSegment:
    """One timed piece of a transcript (OpenAI's ``verbose_json`` segment fields)."""

    id: int
    start: float
    end: float
    text: str
    seek: int = 0
    tokens: list[int] = field(default_factory=list)
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0


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
    """The backend voice that rendered the requested voice."""


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
