"""Audio heads for the in-process gateway: real CPU engines and scripted ones.

The real engines (Piper en_US joe, Whisper tiny.en from their PyPI packages)
load once per session; each test gets a fresh app, database and ledger around
them. Scripted heads cover the gateway's own logic (timeouts, failures,
boundaries) where a real model would only add seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deployments import registry
from deployments.audio.speech_head import SpeechHeadCore
from deployments.audio.transcription_head import TranscriptionHeadCore
from serve_app.billing.records import UsageRecord
from serve_app.billing.store import LedgerStore
from serve_app.heads.client import (
    LocalSpeechClient,
    LocalTranscriptionClient,
    SpeechClient,
    TranscriptionClient,
)
from tests.fakes import scripted_audio  # noqa: F401  (registers the scripted backends)
from tests.fixtures.gateway import CATALOG, GatewayHarness, add_keys, build_harness

PIPER = "piper-joe-tts"
WHISPER = "whisper-tiny-en"
_AUDIO_PRICE = {"mode": "fixed", "per_audio_second": 0.001}


def _speech(model_id: str, backend: str, **config: Any) -> dict[str, Any]:
    return {
        "id": model_id,
        "head": "speech",
        "output_modalities": ["audio"],
        "pricing": _AUDIO_PRICE,
        "engine": {"backend": backend, "config": config},
    }


def _stt(model_id: str, backend: str, **config: Any) -> dict[str, Any]:
    return {
        "id": model_id,
        "head": "transcription",
        "input_modalities": ["audio"],
        "pricing": _AUDIO_PRICE,
        "engine": {"backend": backend, "config": config},
    }


AUDIO_CATALOG: list[dict[str, Any]] = [
    _speech(PIPER, "piper"),
    _speech("scripted-tts", "scripted-speech"),
    _speech("tagged-tts", "scripted-speech", emotion_tags=True),
    _speech("slow-tts", "scripted-speech", delay_s=30),
    _speech("busy-tts", "scripted-speech", gated=True),
    _speech("failing-tts", "scripted-speech", fail=True),
    _speech("headless-tts", "scripted-speech"),
    _stt(WHISPER, "faster-whisper"),
    _stt("scripted-stt", "scripted-transcription"),
    _stt("slow-stt", "scripted-transcription", delay_s=30),
    _stt("failing-stt", "scripted-transcription", fail=True),
    _stt("headless-stt", "scripted-transcription"),
]
HEADLESS = {"headless-tts", "headless-stt"}


@pytest.fixture(scope="session")
def real_speech_core() -> Iterator[SpeechHeadCore]:
    core = SpeechHeadCore(registry.build_engine("speech", "piper", {}))
    asyncio.run(core.start())
    yield core


@pytest.fixture(scope="session")
def real_stt_core() -> Iterator[TranscriptionHeadCore]:
    core = TranscriptionHeadCore(registry.build_engine("transcription", "faster-whisper", {}))
    asyncio.run(core.start())
    yield core


async def _heads(
    speech_core: SpeechHeadCore, stt_core: TranscriptionHeadCore
) -> tuple[dict[str, SpeechClient], dict[str, TranscriptionClient]]:
    speech: dict[str, SpeechClient] = {PIPER: LocalSpeechClient(speech_core)}
    stt: dict[str, TranscriptionClient] = {WHISPER: LocalTranscriptionClient(stt_core)}
    for entry in AUDIO_CATALOG:
        backend, config = entry["engine"]["backend"], entry["engine"]["config"]
        if entry["id"] in HEADLESS or not backend.startswith("scripted"):
            continue
        if entry["head"] == "speech":
            core = SpeechHeadCore(registry.build_engine("speech", backend, config))
            await core.start()
            speech[entry["id"]] = LocalSpeechClient(core)
        else:
            stt_head = TranscriptionHeadCore(
                registry.build_engine("transcription", backend, config)
            )
            await stt_head.start()
            stt[entry["id"]] = LocalTranscriptionClient(stt_head)
    return speech, stt


AudioFactory = Callable[..., Awaitable[GatewayHarness]]


@pytest.fixture
async def make_audio_gateway(
    tmp_path: Path, real_speech_core: SpeechHeadCore, real_stt_core: TranscriptionHeadCore
) -> AsyncIterator[AudioFactory]:
    """``await make_audio_gateway(audio={...})``: the app with every audio head wired."""
    made: list[GatewayHarness] = []

    async def make(**args: Any) -> GatewayHarness:
        speech, stt = await _heads(real_speech_core, real_stt_core)
        folder = tmp_path / f"gw{len(made)}"
        folder.mkdir()
        harness = build_harness(
            folder / "gw.db",
            {"catalog": [*CATALOG, *AUDIO_CATALOG], **args},
            speech_heads=speech,
            transcription_heads=stt,
        )
        add_keys(harness)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        await harness.aclose()


@pytest.fixture
async def audio_gw(make_audio_gateway: AudioFactory) -> GatewayHarness:
    return await make_audio_gateway()


async def ledger_records(harness: GatewayHarness, user: str) -> list[UsageRecord]:
    """The user's committed usage records (the spool is flushed first)."""
    ledger = harness.metering.ledger
    assert ledger is not None
    assert await ledger.flush()
    found = harness.store.get_user(user)
    assert found is not None
    return list(LedgerStore(ledger.store._db).records_for(found.id))
