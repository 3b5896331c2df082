"""Sniffing, tag removal, WAV encoding and decoding with real encoders (no model)."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest

from deployments.audio.audio_io import decode_audio, encode_wav, resample, to_wire_wav
from deployments.audio.base import strip_emotion_tags
from deployments.audio.orpheus_engine import (
    custom_token_numbers,
    frames_from_numbers,
    snac_layers,
    split_text,
)
from serve_app.contract.audio import sniff_container
from serve_app.protocol.errors import InvalidRequestError
from tests.fixtures.audio_files import ENCODINGS, encode, silent_wav_of_size, tone

SNIFFED = {"wav": "wav", "mp3": "mp3", "m4a": "mp4", "flac": "flac", "ogg": "ogg"}


def test_wire_wav_header_is_riff_pcm16_mono_24k() -> None:
    wav, seconds = to_wire_wav(tone(0.5, rate=22_050), 22_050)
    riff, size, wave_id = struct.unpack("<4sI4s", wav[:12])
    assert (riff, wave_id, size) == (b"RIFF", b"WAVE", len(wav) - 8)
    fmt, fmt_len, pcm, channels, rate, byte_rate, align, bits = struct.unpack(
        "<4sIHHIIHH", wav[12:36]
    )
    assert (fmt, fmt_len, pcm, channels, rate, bits) == (b"fmt ", 16, 1, 1, 24_000, 16)
    assert (byte_rate, align) == (48_000, 2)
    data_id, data_len = struct.unpack("<4sI", wav[36:44])
    assert data_id == b"data" and data_len == len(wav) - 44
    assert seconds == pytest.approx(0.5, abs=0.01)


def test_resample_keeps_duration_and_pitch() -> None:
    out = resample(tone(1.0, rate=22_050, hz=300), 22_050, 24_000)
    assert out.size == pytest.approx(24_000, abs=50)
    spectrum = np.abs(np.fft.rfft(out[:24_000]))
    assert np.argmax(spectrum) == pytest.approx(300, abs=2)


@pytest.mark.parametrize("fmt", list(ENCODINGS))
def test_every_format_made_by_a_real_encoder_is_sniffed_and_decoded(fmt: str) -> None:
    data = encode(tone(1.0, hz=440), 24_000, fmt)
    container = sniff_container(data[:64])
    assert container == SNIFFED[fmt]
    samples = decode_audio(data, container, 16_000, max_seconds=60)
    assert samples.size / 16_000 == pytest.approx(1.0, abs=0.1)
    spectrum = np.abs(np.fft.rfft(samples[:16_000]))
    assert np.argmax(spectrum) == pytest.approx(440, abs=3)


@pytest.mark.parametrize(
    "head", [b"\x89PNG\r\n\x1a\n" + bytes(8), b"%PDF-1.7", b"", b"\x1aE\xdf\xa3webm", b"ab"]
)
def test_non_audio_content_is_not_sniffed(head: bytes) -> None:
    assert sniff_container(head) is None


@pytest.mark.parametrize("fmt", ["wav", "mp3", "flac", "ogg", "m4a"])
def test_corrupt_files_are_invalid_audio(fmt: str) -> None:
    data = encode(tone(1.0), 24_000, fmt)
    container = sniff_container(data[:64])
    assert container is not None
    broken = data[:16] + bytes(range(256)) * 4  # the magic survives, the rest is noise
    with pytest.raises(InvalidRequestError) as info:
        decode_audio(broken, container, 16_000, max_seconds=60)
    assert (info.value.code, info.value.param) == ("invalid_audio", "file")


def test_audio_longer_than_the_cap_is_refused() -> None:
    data = silent_wav_of_size(16_000 * 2 * 3 + 44)  # 3 s
    with pytest.raises(InvalidRequestError, match="longer than 2 s"):
        decode_audio(data, "wav", 16_000, max_seconds=2)


def test_encode_wav_clips_out_of_range_samples() -> None:
    wav = encode_wav(np.array([2.0, -2.0, 0.0], dtype=np.float32))
    with wave.open(io.BytesIO(wav)) as read:
        frames = read.readframes(3)
    assert struct.unpack("<3h", frames) == (32767, -32767, 0)


def test_emotion_tags_are_removed_cleanly() -> None:
    text = "Well <laugh> that is funny. <sigh> Fine <chuckle>, let's go!"
    assert strip_emotion_tags(text) == "Well that is funny. Fine, let's go!"
    assert strip_emotion_tags("<laugh>") == ""
    assert strip_emotion_tags("3 < 4 and 5 > 2") == "3 < 4 and 5 > 2"


def test_orpheus_tokens_become_snac_layers() -> None:
    codes = [[7 * f + i for i in range(7)] for f in range(2)]
    text = "".join(
        f"<custom_token_{c + 10 + (k % 7) * 4096}>"
        for k, c in enumerate(code for frame in codes for code in frame)
    )
    numbers = custom_token_numbers(text + "<custom_token_99999>")  # out of codebook: skipped
    frames = frames_from_numbers([*numbers, 10])  # a trailing partial frame is dropped
    assert frames == codes
    coarse, middle, fine = snac_layers(frames)
    assert coarse == [0, 7] and middle == [1, 4, 8, 11] and fine == [2, 3, 5, 6, 9, 10, 12, 13]


def test_orpheus_text_split_keeps_every_word() -> None:
    text = "First sentence here. " * 30 + "x" * 50
    pieces = split_text(text, 120)
    assert all(len(p) <= 120 for p in pieces)
    assert " ".join(pieces).split() == text.split()


def test_snac_codec_decodes_orpheus_frames_to_24k_samples() -> None:
    # The real decode path of the GPU backend, on a small random-weight SNAC 24 kHz layout.
    snac = pytest.importorskip("snac")
    torch = pytest.importorskip("torch")
    from deployments.audio.orpheus_engine import decode_frames

    torch.manual_seed(0)
    model = snac.SNAC(
        sampling_rate=24_000,
        encoder_dim=8,
        encoder_rates=[2, 4, 8, 8],
        decoder_dim=32,
        decoder_rates=[8, 8, 4, 2],
        attn_window_size=None,
        vq_strides=[4, 2, 1],
    ).eval()
    frames = [[(13 * f + i) % 4096 for i in range(7)] for f in range(4)]
    samples = decode_frames(model, frames, "cpu")
    assert samples.dtype == np.float32
    assert samples.size == 4 * 4 * 512  # 4 frames x 4 latent steps x hop 512
    assert decode_frames(model, [], "cpu").size == 0


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
def test_a_file_cut_short_of_its_declared_length_is_invalid_audio(fmt: str) -> None:
    """WAV declares its data size, LAME's MP3 its frame count: half a file is caught,
    not transcribed as if it were the whole recording."""
    data = encode(tone(3.0), 24_000, fmt)
    container = sniff_container(data[:64])
    assert container is not None
    with pytest.raises(InvalidRequestError, match="truncated") as info:
        decode_audio(data[: len(data) // 2], container, 16_000, max_seconds=60)
    assert (info.value.code, info.value.param) == ("invalid_audio", "file")


def test_a_wav_with_an_unknown_length_placeholder_is_read_to_its_end() -> None:
    """Streaming writers put 0 or 0xFFFFFFFF in the size fields: that is not truncation."""
    data = bytearray(silent_wav_of_size(16_000 * 2 + 44))
    for placeholder in (0, 0xFFFFFFFF):
        data[40:44] = placeholder.to_bytes(4, "little")
        samples = decode_audio(bytes(data), "wav", 16_000, max_seconds=60)
        assert samples.size == 16_000


def test_audio_shorter_than_a_tenth_of_a_second_is_refused() -> None:
    data = encode(tone(0.05), 24_000, "wav")
    with pytest.raises(InvalidRequestError, match=r"shorter than 0\.1 s"):
        decode_audio(data, "wav", 16_000, max_seconds=60)
    assert decode_audio(encode(tone(0.1), 24_000, "wav"), "wav", 16_000, 60).size == 1_600
