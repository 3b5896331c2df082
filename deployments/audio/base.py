"""The speech and transcription engine contracts shared by every audio head backend.

A speech head (``deployments.audio.speech_head``) or transcription head
(``deployments.audio.transcription_head``) owns one engine that it receives from
``deployments.registry.build_engine``, never constructs itself: Piper or
faster-whisper on CPU (the embedded default), Orpheus on vLLM or faster-whisper
on CUDA in production, a scripted engine in tests of the gateway's own logic.

Contract (read this before writing a backend):

1. ``start`` loads the model once, before the head reports healthy, and returns
   the facts the head validates requests against (voices, sample rate).
2. ``synthesize`` / ``transcribe`` are ``async`` and must never block the event
   loop: CPU backends run the model in a worker thread (``asyncio.to_thread``)
   so one replica keeps answering health checks and queues further requests
   while a long one runs. The head bounds how many run at once.
3. A speech engine receives text that is ready to speak: the head has already
   removed inline emotion tags (``<laugh>``) when ``SpeechEngineInfo.emotion_tags``
   is False. It returns float samples in [-1, 1] at any rate; the head converts
   them to the wire format (24 kHz mono 16-bit WAV).
4. A transcription engine receives mono float32 samples at
   ``TranscriptionEngineInfo.sample_rate``: the head decodes and resamples the
   uploaded file with a real decoder first, so engines never see containers.
5. Caller mistakes raise ``InvalidRequestError``; anything else raises and the
   head reports a 502. Everything the head passes on crosses a Ray handle, so
   results are plain dataclasses of builtins (and numpy arrays inside the head).

What the gateway needs as well (the API's voices, ``sniff_container``, the
transcript segment a result carries) lives in ``serve_app.contract.audio``.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from serve_app.contract.audio import TranscriptSegment

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

OUTPUT_SAMPLE_RATE = 24_000
"""docs/reference/audio.md: speech is returned as mono 24 kHz (16-bit PCM WAV)."""

_EMOTION_TAG = re.compile(r"<\s*/?\s*[A-Za-z][A-Za-z_-]{0,31}\s*/?\s*>")
_SPACES = re.compile(r"[ \t]{2,}")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")


def strip_emotion_tags(text: str) -> str:
    """Remove inline tags such as ``<laugh>`` for engines that cannot perform them.

    Removing the tag alone would leave doubled spaces or a space before
    punctuation, which some phonemizers read as a pause; both are tidied.
    """
    cleaned = _EMOTION_TAG.sub(" ", text)
    cleaned = _SPACE_BEFORE_PUNCT.sub(r"\1", cleaned)
    return _SPACES.sub(" ", cleaned).strip()


@dataclass
class SpeechEngineInfo:
    """What a loaded speech model offers."""

    voices: dict[str, str]
    """API voice -> the backend's own voice it is rendered with."""
    sample_rate: int
    emotion_tags: bool = False
    """True when the model performs inline tags (Orpheus); else the head strips them."""


@dataclass
class SynthesizedAudio:
    """Mono float samples in [-1, 1] at ``sample_rate``."""

    samples: npt.NDArray[np.float32]
    sample_rate: int


@dataclass
class TranscriptionEngineInfo:
    """What a loaded transcription model expects."""

    sample_rate: int = 16_000
    multilingual: bool = False


@dataclass
class TranscriptionOptions:
    """Optional request fields a transcription engine honours."""

    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None


@dataclass
class Transcript:
    text: str
    language: str | None = None
    segments: list[TranscriptSegment] = field(default_factory=list)
    """Timed pieces, in order; engines without timing give one segment or none."""


class SpeechEngine(abc.ABC):
    """A text-to-speech model bound to one loaded checkpoint."""

    @abc.abstractmethod
    async def start(self) -> SpeechEngineInfo:
        """Load the model; called once by the head before it reports healthy."""

    @abc.abstractmethod
    async def synthesize(self, text: str, voice: str) -> SynthesizedAudio:
        """Speak ``text`` with the API voice ``voice`` (a key of ``info.voices``)."""

    async def check_health(self) -> None:
        """Raise when the engine can no longer serve."""
        return None

    async def shutdown(self) -> None:
        """Release the model; called when the replica stops."""
        return None


class TranscriptionEngine(abc.ABC):
    """A speech-to-text model bound to one loaded checkpoint."""

    @abc.abstractmethod
    async def start(self) -> TranscriptionEngineInfo:
        """Load the model; called once by the head before it reports healthy."""

    @abc.abstractmethod
    async def transcribe(
        self, samples: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> Transcript:
        """Transcribe mono float32 samples at ``info.sample_rate``."""

    async def check_health(self) -> None:
        """Raise when the engine can no longer serve."""
        return None

    async def shutdown(self) -> None:
        """Release the model; called when the replica stops."""
        return None
