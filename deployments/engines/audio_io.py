"""Audio decoding, resampling and WAV encoding for the audio heads (PyAV + numpy).

PyAV wraps FFmpeg's own demuxers, decoders and libswresample, so every format
of spec 4.5 is decoded by a real decoder and resampling is done with a proper
filter rather than by interpolation. These functions block: the heads call them
in worker threads. Imported only by heads and engines, never by the gateway.
"""

from __future__ import annotations

import io
import logging
import wave
from collections.abc import Iterable
from typing import Any

import av
import numpy as np
import numpy.typing as npt

from deployments.engines.audio_base import OUTPUT_SAMPLE_RATE, AudioContainer
from serve_app.protocol.errors import InvalidRequestError

logger = logging.getLogger(__name__)

Samples = npt.NDArray[np.float32]

_DEMUXER_OPTIONS = {"enable_drefs": "0", "use_absolute_path": "0"}
"""Never follow references to other files from inside a caller's MP4."""


def invalid_audio(reason: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"The file could not be decoded as audio: {reason}.", code="invalid_audio", param="file"
    )


def decode_audio(
    data: bytes, container: AudioContainer, sample_rate: int, max_seconds: float
) -> Samples:
    """Decode ``data`` as ``container`` to mono float32 at ``sample_rate``.

    Raises ``InvalidRequestError`` (``invalid_audio``) for corrupt or empty
    files and for audio longer than ``max_seconds`` (a small compressed file
    can expand to hours of samples; the cap bounds the head's memory).
    """
    max_samples = int(max_seconds * sample_rate)
    chunks: list[Samples] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), mode="r", format=container, options=_DEMUXER_OPTIONS) as c:
            streams = [s for s in c.streams if s.type == "audio"]
            if not streams:
                raise invalid_audio("it has no audio stream")
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
    return samples


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
    """Engine output -> the spec's 24 kHz mono 16-bit WAV, and its duration in seconds."""
    at_24k = resample(samples, sample_rate, OUTPUT_SAMPLE_RATE)
    return encode_wav(at_24k), at_24k.size / OUTPUT_SAMPLE_RATE
