"""The CPU backends on their packaged models: Piper en_US joe and Whisper tiny.en."""

from __future__ import annotations

import io
import re
import wave

import numpy as np
import pytest

from deployments.audio.speech_head import SpeechHeadCore
from deployments.audio.transcription_head import TranscriptionHeadCore
from serve_app.contract.audio import (
    SPEC_VOICES,
    SpeechHeadRequest,
    SpeechHeadResult,
    TranscriptionHeadRequest,
    TranscriptionHeadResult,
    sniff_container,
)
from serve_app.contract.errors import HeadFailure
from tests.fixtures.audio_files import ENCODINGS, encode

SENTENCE = "The quick brown fox jumps over the lazy dog."


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


async def speak(core: SpeechHeadCore, text: str, voice: str = "tara") -> SpeechHeadResult:
    result = await core.synthesize(SpeechHeadRequest("t", text, voice))
    assert isinstance(result, SpeechHeadResult), result
    return result


def pcm(wav: bytes) -> tuple[wave._wave_params, np.ndarray]:
    with wave.open(io.BytesIO(wav)) as read:
        params = read.getparams()
        frames = np.frombuffer(read.readframes(params.nframes), dtype="<i2")
    return params, frames


async def test_piper_speaks_24k_mono_16bit_wav(real_speech_core: SpeechHeadCore) -> None:
    result = await speak(real_speech_core, SENTENCE)
    params, frames = pcm(result.wav)
    assert (params.nchannels, params.framerate, params.sampwidth) == (1, 24_000, 2)
    assert result.wav[:4] == b"RIFF" and result.wav[8:16] == b"WAVEfmt "
    assert result.seconds == pytest.approx(params.nframes / 24_000)
    assert 1.0 < result.seconds < 8.0
    assert np.abs(frames).max() > 3000  # speech, not silence
    assert result.voice == "en_US-joe-medium"


async def test_every_spec_voice_maps_to_a_real_voice(real_speech_core: SpeechHeadCore) -> None:
    assert real_speech_core.info is not None
    assert set(real_speech_core.info.voices) == set(SPEC_VOICES)
    for voice in SPEC_VOICES:
        result = await speak(real_speech_core, "Hello.", voice)
        assert result.voice == "en_US-joe-medium"
        assert result.seconds > 0.2


async def test_unknown_voice_is_a_400_from_the_head(real_speech_core: SpeechHeadCore) -> None:
    failure = await real_speech_core.synthesize(SpeechHeadRequest("t", "Hi.", "alloy"))
    assert isinstance(failure, HeadFailure)
    assert (failure.status_code, failure.param) == (400, "voice")


async def test_emotion_tags_are_not_spoken(
    real_speech_core: SpeechHeadCore, real_stt_core: TranscriptionHeadCore
) -> None:
    tagged = await speak(real_speech_core, f"<laugh> {SENTENCE} <sigh>")
    heard = await real_stt_core.transcribe(TranscriptionHeadRequest("t", tagged.wav, "wav"))
    assert isinstance(heard, TranscriptionHeadResult)
    assert words(heard.text) == words(SENTENCE)  # no "laugh", "sigh" or angle brackets
    only_tags = await real_speech_core.synthesize(SpeechHeadRequest("t", "<laugh> <sigh>", "tara"))
    assert isinstance(only_tags, HeadFailure) and only_tags.param == "input"


async def test_round_trip_recovers_the_words(
    real_speech_core: SpeechHeadCore, real_stt_core: TranscriptionHeadCore
) -> None:
    speech = await speak(real_speech_core, SENTENCE)
    result = await real_stt_core.transcribe(TranscriptionHeadRequest("t", speech.wav, "wav"))
    assert isinstance(result, TranscriptionHeadResult), result
    assert words(result.text) == words(SENTENCE)
    assert result.seconds == pytest.approx(speech.seconds, abs=0.01)
    # verbose_json's segments: Whisper's own, in order, inside the audio, saying the text.
    assert result.segments and result.language == "en"
    assert [s.id for s in result.segments] == list(range(len(result.segments)))
    assert 0 <= result.segments[0].start < result.segments[-1].end <= result.seconds + 0.5
    assert words(" ".join(s.text for s in result.segments)) == words(SENTENCE)


@pytest.mark.parametrize("fmt", list(ENCODINGS))
async def test_every_format_is_transcribed(
    fmt: str, real_speech_core: SpeechHeadCore, real_stt_core: TranscriptionHeadCore
) -> None:
    speech = await speak(real_speech_core, "Hello world, this is a test.")
    _, frames = pcm(speech.wav)
    data = encode(frames.astype(np.float32) / 32768.0, 24_000, fmt)
    container = sniff_container(data[:64])
    assert container is not None
    result = await real_stt_core.transcribe(TranscriptionHeadRequest("t", data, container))
    assert isinstance(result, TranscriptionHeadResult), result
    assert {"hello", "world", "this", "test"} <= set(words(result.text))
    assert result.seconds == pytest.approx(speech.seconds, abs=0.1)


async def test_corrupt_upload_is_a_400(real_stt_core: TranscriptionHeadCore) -> None:
    data = b"fLaC" + bytes(5000)
    failure = await real_stt_core.transcribe(TranscriptionHeadRequest("t", data, "flac"))
    assert isinstance(failure, HeadFailure)
    assert (failure.status_code, failure.code, failure.param) == (400, "invalid_audio", "file")


async def test_head_rechecks_the_container(real_stt_core: TranscriptionHeadCore) -> None:
    data = encode(np.zeros(16_000, np.float32), 16_000, "wav")
    failure = await real_stt_core.transcribe(TranscriptionHeadRequest("t", data, "mp3"))
    assert isinstance(failure, HeadFailure) and failure.code == "invalid_audio"


async def test_silence_is_not_transcribed_as_words(real_stt_core: TranscriptionHeadCore) -> None:
    data = encode(np.zeros(16_000 * 10, np.float32), 16_000, "wav")
    result = await real_stt_core.transcribe(TranscriptionHeadRequest("t", data, "wav"))
    assert isinstance(result, TranscriptionHeadResult)
    assert result.text == ""
    assert result.seconds == pytest.approx(10.0)
