"""``POST /v1/audio/transcriptions`` through the real app (docs/reference/audio.md,
docs/reference/common.md)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.fixtures.audio_files import ENCODINGS, encode, silent_wav_of_size, tone
from tests.fixtures.gateway import GatewayHarness
from tests.unit.audio.conftest import PIPER, WHISPER, AudioFactory, ledger_records

TRANSCRIPTIONS = "/v1/audio/transcriptions"
LIMIT = 25 * 1024 * 1024


async def upload(
    gw: GatewayHarness,
    data: bytes | None,
    model: str | None = "scripted-stt",
    filename: str = "clip.wav",
    content_type: str = "audio/wav",
    **fields: str,
) -> httpx.Response:
    form = {**({"model": model} if model else {}), **fields}
    files = {"file": (filename, data, content_type)} if data is not None else None
    async with gw.client(gw.keys["user"]) as http:
        return await http.post(TRANSCRIPTIONS, data=form, files=files)


def stt_calls(gw: GatewayHarness, model: str = "scripted-stt") -> list[Any]:
    calls: list[Any] = gw.app.state.gateway.audio.transcription_heads[model].core.engine.calls
    return calls


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


async def test_round_trip_through_both_routes(audio_gw: GatewayHarness) -> None:
    sentence = "Please send the report to the team by Friday."
    async with audio_gw.client(audio_gw.keys["user"]) as http:
        speech = await http.post(
            "/v1/audio/speech", json={"model": PIPER, "input": sentence, "voice": "mia"}
        )
    assert speech.status_code == 200
    resp = await upload(audio_gw, speech.content, model=WHISPER)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    # Piper samples its prosody: allow Whisper tiny's "a"/"the" slips, not lost content words.
    assert {w for w in words(sentence) if len(w) > 3} <= set(words(body["text"]))
    assert body["usage"]["type"] == "duration"
    assert body["usage"]["seconds"] == pytest.approx((len(speech.content) - 44) / 48_000, abs=0.01)
    [record] = [r for r in await ledger_records(audio_gw, "alice") if r.route == "transcriptions"]
    assert record.audio_seconds == pytest.approx(body["usage"]["seconds"])
    assert record.completion_tokens > 0  # estimated from the text (docs/reference/audio.md)


@pytest.mark.parametrize("fmt", list(ENCODINGS))
async def test_every_format_is_read_by_content_not_name(audio_gw: GatewayHarness, fmt: str) -> None:
    data = encode(tone(0.5), 24_000, fmt)
    resp = await upload(audio_gw, data, filename="notes.txt", content_type="text/plain")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "text": "scripted transcript",
        "usage": {"type": "duration", "seconds": pytest.approx(0.5, abs=0.1)},
    }


async def test_text_response_format(audio_gw: GatewayHarness) -> None:
    resp = await upload(audio_gw, encode(tone(0.2), 24_000, "wav"), response_format="text")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    assert resp.text == "scripted transcript"


async def test_verbose_json_response_format(audio_gw: GatewayHarness) -> None:
    """OpenAI's ``verbose_json``: language, duration and segments around the text."""
    resp = await upload(audio_gw, encode(tone(0.5), 24_000, "ogg"), response_format="verbose_json")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["task"] == "transcribe" and body["language"] == "en"
    assert body["text"] == "scripted transcript"
    assert body["duration"] == pytest.approx(0.5, abs=0.05) == body["usage"]["seconds"]
    [segment] = body["segments"]
    assert (segment["id"], segment["start"], segment["text"]) == (0, 0.0, "scripted transcript")
    assert segment["end"] == pytest.approx(body["duration"])


async def test_options_reach_the_engine_and_unknown_fields_are_named(
    audio_gw: GatewayHarness,
) -> None:
    data = encode(tone(0.2), 24_000, "flac")
    resp = await upload(audio_gw, data, language="en", prompt="Names: Ada.", timestamp="x")
    assert resp.status_code == 200
    assert resp.headers["x-service-ignored-params"] == "timestamp"
    [(_, options)] = stt_calls(audio_gw)
    assert (options.language, options.prompt) == ("en", "Names: Ada.")


async def test_file_of_exactly_25_mib_is_accepted(audio_gw: GatewayHarness) -> None:
    resp = await upload(audio_gw, silent_wav_of_size(LIMIT))
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["seconds"] == pytest.approx((LIMIT - 44) / 32_000)


async def test_one_byte_over_25_mib_is_413(audio_gw: GatewayHarness) -> None:
    resp = await upload(audio_gw, silent_wav_of_size(LIMIT + 2)[: LIMIT + 1])
    assert resp.status_code == 413, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == ("request_too_large", "file")
    assert stt_calls(audio_gw) == []


async def test_declared_oversize_body_is_413_before_reading(audio_gw: GatewayHarness) -> None:
    resp = await upload(audio_gw, bytes(28 * 1024 * 1024))
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"
    assert resp.headers["connection"] == "close"


async def test_streamed_oversize_body_is_cut_off_with_413(audio_gw: GatewayHarness) -> None:
    boundary = "xyz"

    async def body() -> AsyncIterator[bytes]:
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
            f'scripted-stt\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            'filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n'
        ).encode()
        chunk = bytes(1024 * 1024)
        for _ in range(30):  # no Content-Length: the middleware counts as it streams
            yield chunk

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    async with audio_gw.client(audio_gw.keys["user"]) as http:
        resp = await http.post(TRANSCRIPTIONS, content=body(), headers=headers)
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize(
    "data",
    [
        b"\x89PNG\r\n\x1a\n" + bytes(100),
        b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(200),
        b"OggS" + bytes(range(256)) * 8,
        b"",
    ],
    ids=["png", "corrupt-wav", "corrupt-ogg", "empty"],
)
async def test_non_audio_and_corrupt_files_are_400(audio_gw: GatewayHarness, data: bytes) -> None:
    resp = await upload(audio_gw, data)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_audio", "file")


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
async def test_truncated_and_too_short_files_are_400(audio_gw: GatewayHarness, fmt: str) -> None:
    """A file cut in half (its header declares more) or a 50 ms clip is not transcribed."""
    whole = encode(tone(2.0), 24_000, fmt)
    for data in (whole[: len(whole) // 2], encode(tone(0.05), 24_000, fmt)):
        resp = await upload(audio_gw, data)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_audio", "file")
    assert stt_calls(audio_gw) == []


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"data": None}, "file"),
        ({"data": b"RIFF", "model": None}, "model"),
        ({"data": b"RIFF", "response_format": "srt"}, "response_format"),
        ({"data": b"RIFF", "temperature": "hot"}, "temperature"),
    ],
)
async def test_malformed_forms_are_400_with_param(
    audio_gw: GatewayHarness, kwargs: dict[str, Any], param: str
) -> None:
    resp = await upload(audio_gw, **kwargs)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


async def test_a_speech_model_is_refused(audio_gw: GatewayHarness) -> None:
    resp = await upload(audio_gw, encode(tone(0.2), 24_000, "wav"), model=PIPER)
    assert resp.status_code == 400
    assert "/v1/audio/speech" in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    ("model", "status", "code"),
    [
        ("failing-stt", 502, "upstream_error"),
        ("headless-stt", 503, "model_unavailable"),
        ("slow-stt", 504, "upstream_timeout"),
    ],
)
async def test_head_failures_map_to_spec_statuses(
    make_audio_gateway: AudioFactory, model: str, status: int, code: str
) -> None:
    gw = await make_audio_gateway(audio={"transcription_timeout_s": 0.3})
    resp = await upload(gw, encode(tone(0.2), 24_000, "wav"), model=model)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code
    assert await ledger_records(gw, "alice") == []  # failures are not billed


async def test_openai_sdk_transcriptions_create(audio_gw: GatewayHarness) -> None:
    client = audio_gw.openai(audio_gw.keys["user"])
    data = encode(np.zeros(8_000, np.float32), 16_000, "mp3")
    result = await client.audio.transcriptions.create(
        model="scripted-stt", file=("memo.mp3", data, "audio/mpeg")
    )
    assert result.text == "scripted transcript"
    usage = result.usage
    assert usage is not None and usage.type == "duration"
    assert usage.seconds == pytest.approx(0.5, abs=0.1)
    verbose = await client.audio.transcriptions.create(
        model="scripted-stt", file=("memo.mp3", data, "audio/mpeg"), response_format="verbose_json"
    )
    assert verbose.language == "en" and verbose.duration == pytest.approx(0.5, abs=0.1)
    assert verbose.segments is not None and verbose.segments[0].text == "scripted transcript"
    text = await client.audio.transcriptions.create(
        model="scripted-stt", file=("memo.mp3", data, "audio/mpeg"), response_format="text"
    )
    assert text == "scripted transcript"
