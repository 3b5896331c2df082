"""Audio decoding, resampling and WAV encoding for the audio heads (PyAV + numpy).

PyAV wraps FFmpeg's own demuxers, decoders and libswresample, so every format
of docs/reference/audio.md#transcriptions is decoded by a real decoder and resampling is done with a
proper filter rather than by interpolation. These functions block: the heads call them
in worker threads. Imported only by heads and engines, never by the gateway.
"""

from __future__ import annotations

import io
import logging
import re
import wave
from collections.abc import Iterable
from typing import Any

import av
import numpy as np
import numpy.typing as npt

from deployments.audio.base import OUTPUT_SAMPLE_RATE
from serve_app.contract.audio import AudioContainer
from serve_app.contract.errors import InvalidRequestError

logger = logging.getLogger(__name__)

Samples = npt.NDArray[np.float32]

_DEMUXER_OPTIONS = {"enable_drefs": "0", "use_absolute_path": "0"}
"""Never follow references to other files from inside a caller's MP4."""

MIN_AUDIO_SECONDS = 0.1
"""Shortest decoded audio accepted (OpenAI's floor too): anything shorter is no recording,
typically a file cut off right after its header."""

_WAV_SIZE_PLACEHOLDER = 0x7FFF0000
"""WAV data sizes from here up (and 0) are "length unknown" marks of streaming writers."""
_MP3_LENGTH_TAGS = (b"Xing", b"Info", b"VBRI")
_MPEG_SYNC = re.compile(rb"\xff[\xe0-\xff]")


def invalid_audio(reason: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"The file could not be decoded as audio: {reason}.", code="invalid_audio", param="file"
    )


def decode_audio(
    data: bytes, container: AudioContainer, sample_rate: int, max_seconds: float
) -> Samples:
    """Decode ``data`` as ``container`` to mono float32 at ``sample_rate``.

    Raises ``InvalidRequestError`` (``invalid_audio``) for corrupt or empty
    files, for audio longer than ``max_seconds`` (a small compressed file can
    expand to hours of samples; the cap bounds the head's memory) or shorter
    than ``MIN_AUDIO_SECONDS``, and for files that end before the length their
    header declares (FFmpeg decodes what is there without complaint, so a
    half-uploaded recording would otherwise be transcribed as if it were whole).
    """
    max_samples = int(max_seconds * sample_rate)
    chunks: list[Samples] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), mode="r", format=container, options=_DEMUXER_OPTIONS) as c:
            streams = [s for s in c.streams if s.type == "audio"]
            if not streams:
                raise invalid_audio("it has no audio stream")
            declared = _declared_seconds(data, container, streams[0])
            resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
            for frame in c.decode(streams[0]):
                if not isinstance(frame, av.AudioFrame):
                    continue
                for chunk in _frames_to_arrays(resampler.resample(frame)):
                    chunks.append(chunk)
                    total += chunk.size
                if total > max_samples:
                    raise invalid_audio(f"it is longer than {max_seconds:g} s")
            chunks.extend(_frames_to_arrays(resampler.resample(None)))
    except InvalidRequestError:
        raise
    except (av.FFmpegError, ValueError, EOFError, OSError) as err:
        logger.info("audio decode failed (%s): %s", container, err)
        raise invalid_audio(f"{container} data is corrupt or truncated") from None
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise invalid_audio("it contains no audio samples")
    seconds = samples.size / sample_rate
    if (container == "wav" and _wav_cut_short(data)) or (
        declared is not None and seconds < declared * 0.98 - 0.05
    ):
        raise invalid_audio(f"{container} data is truncated (the file ends early)")
    if seconds < MIN_AUDIO_SECONDS:
        raise invalid_audio(f"it is shorter than {MIN_AUDIO_SECONDS:g} s")
    return samples


def _declared_seconds(data: bytes, container: AudioContainer, stream: Any) -> float | None:
    """The duration the file's own header states exactly, where it states one.

    FLAC (STREAMINFO) and MP4 (``moov``) always do; MP3 only with a Xing/Info/VBRI
    frame (without one FFmpeg estimates from the bitrate, which is no claim); Ogg
    never (its length is the last page's, so it shrinks with the file). WAV is
    checked on its data chunk instead: FFmpeg derives its duration from the size.
    """
    exact = container in ("flac", "mp4") or (container == "mp3" and _mp3_declares_length(data))
    if not exact or not stream.duration or stream.time_base is None:
        return None
    return float(stream.duration * stream.time_base)


def _wav_cut_short(data: bytes) -> bool:
    """True when a RIFF WAV's data chunk declares more bytes than the file holds."""
    if data[:4] != b"RIFF":
        return False  # RF64 keeps its real sizes in a ds64 chunk; FFmpeg validates it
    offset = 12
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset + 4 : offset + 8], "little")
        if data[offset : offset + 4] == b"data":
            if size == 0 or size >= _WAV_SIZE_PLACEHOLDER:
                return False
            missing = size - (len(data) - offset - 8)
            return missing > max(1024, size // 100)
        offset += 8 + size + (size & 1)
    return False


def _mp3_declares_length(data: bytes) -> bool:
    """Whether the first MPEG frame (after an ID3v2 tag) is a Xing/Info/VBRI length frame."""
    start = 0
    if data[:3] == b"ID3" and len(data) >= 10:
        tag_size = 0
        for byte in data[6:10]:  # a "synchsafe" integer: 7 bits per byte
            tag_size = tag_size << 7 | byte & 0x7F
        start = 10 + tag_size + (10 if data[5] & 0x10 else 0)
    sync = _MPEG_SYNC.search(data, start, start + 4096)
    return sync is not None and any(
        tag in data[sync.start() : sync.start() + 200] for tag in _MP3_LENGTH_TAGS
    )


def _frames_to_arrays(frames: Iterable[Any]) -> list[Samples]:
    return [np.asarray(f.to_ndarray(), dtype=np.float32).reshape(-1) for f in frames]


def resample(samples: Samples, rate_in: int, rate_out: int) -> Samples:
    """Mono float32 from ``rate_in`` to ``rate_out`` with libswresample."""
    mono = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
    if rate_in == rate_out or mono.size == 0:
        return mono
    frame = av.AudioFrame.from_ndarray(mono.reshape(1, -1), format="flt", layout="mono")
    frame.sample_rate = rate_in
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate_out)
    parts = _frames_to_arrays(resampler.resample(frame)) + _frames_to_arrays(
        resampler.resample(None)
    )
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def encode_wav(samples: Samples, sample_rate: int = OUTPUT_SAMPLE_RATE) -> bytes:
    """RIFF/WAVE, PCM 16-bit little endian, mono; the header sizes are exact."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.tobytes())
    return buffer.getvalue()


def to_wire_wav(samples: Samples, sample_rate: int) -> tuple[bytes, float]:
    """Engine output -> the API's 24 kHz mono 16-bit WAV, and its duration in seconds."""
    at_24k = resample(samples, sample_rate, OUTPUT_SAMPLE_RATE)
    return encode_wav(at_24k), at_24k.size / OUTPUT_SAMPLE_RATE
