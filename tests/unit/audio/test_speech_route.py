"""``POST /v1/audio/speech`` through the real app (docs/reference/audio.md,
docs/reference/common.md)."""

from __future__ import annotations

import asyncio
import io
import struct
import wave
from typing import Any

import httpx
import pytest

from serve_app.contract.audio import SPEC_VOICES
from tests.fixtures.gateway import GatewayHarness
from tests.fixtures.waiting import until
from tests.unit.audio.conftest import PIPER, AudioFactory, ledger_records

SPEECH = "/v1/audio/speech"


async def post(gw: GatewayHarness, body: dict[str, Any], key: str = "user") -> httpx.Response:
    async with gw.client(gw.keys[key]) as http:
        return await http.post(SPEECH, json=body)


def wav_params(data: bytes) -> wave._wave_params:
    with wave.open(io.BytesIO(data)) as read:
        return read.getparams()


def scripted_calls(gw: GatewayHarness, model: str) -> list[tuple[str, str]]:
    client = gw.app.state.gateway.audio.speech_heads[model]
    calls: list[tuple[str, str]] = client.core.engine.calls
    return calls


async def test_speech_is_24k_mono_16bit_wav(audio_gw: GatewayHarness) -> None:
    resp = await post(audio_gw, {"model": PIPER, "input": "Good morning, everyone."})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "audio/wav"
    assert resp.content[:4] == b"RIFF" and resp.content[8:12] == b"WAVE"
    params = wav_params(resp.content)
    assert (params.nchannels, params.framerate, params.sampwidth) == (1, 24_000, 2)
    assert params.nframes > 24_000 // 2
    assert resp.headers["x-service-voice"] == "en_US-joe-medium"


async def test_every_voice_and_the_default(audio_gw: GatewayHarness) -> None:
    for voice in (*SPEC_VOICES, None):
        body = {"model": PIPER, "input": "Hi there.", **({"voice": voice} if voice else {})}
        resp = await post(audio_gw, body)
        assert resp.status_code == 200, (voice, resp.text)
        assert wav_params(resp.content).framerate == 24_000


async def test_default_voice_is_tara(audio_gw: GatewayHarness) -> None:
    assert (await post(audio_gw, {"model": "scripted-tts", "input": "Hi."})).status_code == 200
    body = {"model": "scripted-tts", "input": "Hey.", "voice": None}
    assert (await post(audio_gw, body)).status_code == 200  # null is "not given"
    assert scripted_calls(audio_gw, "scripted-tts") == [("Hi.", "tara"), ("Hey.", "tara")]


async def test_wav_header_fields_are_exact(audio_gw: GatewayHarness) -> None:
    """docs/reference/audio.md byte by byte: RIFF size, PCM fmt chunk (mono, 24 kHz, 48000 B/s,
    align 2, 16 bits) and a data chunk holding exactly the rest of the file."""
    resp = await post(audio_gw, {"model": PIPER, "input": "Header check.", "voice": "dan"})
    assert resp.status_code == 200, resp.text
    wav = resp.content
    assert struct.unpack("<4sI4s", wav[:12]) == (b"RIFF", len(wav) - 8, b"WAVE")
    assert struct.unpack("<4sIHHIIHH", wav[12:36]) == (b"fmt ", 16, 1, 1, 24_000, 48_000, 2, 16)
    assert struct.unpack("<4sI", wav[36:44]) == (b"data", len(wav) - 44)
    assert len(wav) > 44 + 48_000 // 4  # real audio, not an empty file


async def test_input_with_nothing_to_pronounce_is_400(audio_gw: GatewayHarness) -> None:
    """Piper renders no samples for bare punctuation: a 400, never an empty 200 WAV."""
    resp = await post(audio_gw, {"model": PIPER, "input": "..."})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_value", "input")


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": "Hi.", "voice": "alloy"}, "voice", "invalid_value"),
        ({"input": ""}, "input", "invalid_value"),
        ({"input": "   \n "}, "input", "invalid_value"),
        ({"input": "a" * 4097}, "input", "invalid_value"),
        ({}, "input", "missing_required_parameter"),
        ({"input": "Hi.", "response_format": "mp3"}, "response_format", "unsupported_value"),
    ],
)
async def test_bad_requests_are_400_with_param(
    audio_gw: GatewayHarness, body: dict[str, Any], param: str, code: str
) -> None:
    resp = await post(audio_gw, {"model": "scripted-tts", **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert scripted_calls(audio_gw, "scripted-tts") == []


async def test_4096_characters_are_accepted(audio_gw: GatewayHarness) -> None:
    text = ("word " * 820)[:4096]
    resp = await post(audio_gw, {"model": "scripted-tts", "input": text, "voice": "Zoe"})
    assert resp.status_code == 200, resp.text
    assert scripted_calls(audio_gw, "scripted-tts")[0][1] == "zoe"


async def test_emotion_tags_reach_only_models_that_perform_them(audio_gw: GatewayHarness) -> None:
    text = "Oh <laugh> that is funny <sigh>."
    for model in ("tagged-tts", "scripted-tts"):
        assert (await post(audio_gw, {"model": model, "input": text})).status_code == 200
    assert scripted_calls(audio_gw, "tagged-tts")[0][0] == text
    assert scripted_calls(audio_gw, "scripted-tts")[0][0] == "Oh that is funny."


async def test_model_routing_errors(audio_gw: GatewayHarness) -> None:
    wrong = await post(audio_gw, {"model": "scripted-chat", "input": "Hi."})
    assert wrong.status_code == 400
    assert wrong.json()["error"]["code"] == "model_not_supported_for_endpoint"
    unknown = await post(audio_gw, {"model": "nope", "input": "Hi."})
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "model_not_found")
    async with audio_gw.client() as http:
        anonymous = await http.post(SPEECH, json={"model": PIPER, "input": "Hi."})
    assert anonymous.status_code == 401


@pytest.mark.parametrize(
    ("model", "status", "code"),
    [
        ("failing-tts", 502, "upstream_error"),
        ("headless-tts", 503, "model_unavailable"),
        ("slow-tts", 504, "upstream_timeout"),
    ],
)
async def test_head_failures_map_to_spec_statuses(
    make_audio_gateway: AudioFactory, model: str, status: int, code: str
) -> None:
    gw = await make_audio_gateway(audio={"speech_timeout_s": 0.3})
    resp = await post(gw, {"model": model, "input": "Hi."})
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code


async def test_unknown_fields_are_named_as_ignored(audio_gw: GatewayHarness) -> None:
    resp = await post(audio_gw, {"model": "scripted-tts", "input": "Hi.", "speed": 1.5})
    assert resp.status_code == 200
    assert resp.headers["x-service-ignored-params"] == "speed"


async def test_a_long_synthesis_does_not_block_other_requests(audio_gw: GatewayHarness) -> None:
    """Another request is answered while a synthesis holds its worker thread: the synthesis
    ends only when the test opens its gate, after that answer (no timer decides the order)."""
    gate = audio_gw.app.state.gateway.audio.speech_heads["busy-tts"].core.engine.gate
    speech = asyncio.ensure_future(post(audio_gw, {"model": "busy-tts", "input": "Hi."}))
    try:
        await until(gate.entered.is_set)  # the synthesis is blocking its worker thread
        async with audio_gw.client(audio_gw.keys["user"]) as http:
            assert (await http.get("/v1/models")).status_code == 200
        assert not speech.done()
    finally:
        gate.open()
    assert (await speech).status_code == 200


async def test_audio_seconds_go_to_the_ledger(audio_gw: GatewayHarness) -> None:
    resp = await post(audio_gw, {"model": "scripted-tts", "input": "one two three four"})
    assert resp.status_code == 200
    [record] = await ledger_records(audio_gw, "alice")
    assert (record.model, record.route, record.status) == ("scripted-tts", "speech", "ok")
    assert record.audio_seconds == pytest.approx(wav_params(resp.content).nframes / 24_000)
    assert record.prompt_tokens == 5  # 18 characters, estimated at 4 per token
    assert record.cost == pytest.approx(record.audio_seconds * 0.001)


async def test_rate_limit_applies_to_speech(audio_gw: GatewayHarness) -> None:
    audio_gw.store.update_user("alice", rpm=1, tpm=1000)
    first = await post(audio_gw, {"model": "scripted-tts", "input": "Hi."})
    assert first.status_code == 200
    # OpenAI's pacing headers on the audio answer too ("Hi." is estimated at 1 token).
    assert first.headers["x-ratelimit-limit-requests"] == "1"
    assert first.headers["x-ratelimit-remaining-requests"] == "0"
    assert first.headers["x-ratelimit-remaining-tokens"] == "999"
    limited = await post(audio_gw, {"model": "scripted-tts", "input": "Hi."})
    assert (limited.status_code, limited.json()["error"]["code"]) == (429, "rate_limit_exceeded")
    assert limited.headers["x-ratelimit-remaining-requests"] == "0"


async def test_openai_sdk_speech_create(audio_gw: GatewayHarness) -> None:
    client = audio_gw.openai(audio_gw.keys["user"])
    response = await client.audio.speech.create(model=PIPER, voice="leo", input="Hello there.")
    data = response.content
    assert wav_params(data).framerate == 24_000
