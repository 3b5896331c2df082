"""Scripted speech and transcription engines for tests of the gateway's own logic.

They follow the engine contract of ``deployments.audio.base`` (async,
blocking work in threads) without a model: speech is a tone whose length
follows the text, transcription returns configured text. ``delay_s`` holds
the call on the event loop (timeouts), ``gated`` blocks a worker thread until the
test opens the engine's ``gate`` (a replica busy with a long job whose end the test
decides, not a timer), ``fail`` raises (the head's 502).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from deployments import registry
from deployments.audio.base import (
    SpeechEngine,
    SpeechEngineInfo,
    SynthesizedAudio,
    Transcript,
    TranscriptionEngine,
    TranscriptionEngineInfo,
    TranscriptionOptions,
)
from serve_app.contract.audio import SPEC_VOICES, TranscriptSegment

SCRIPTED_RATE = 16_000


GATE_GUARD_S = 60.0
"""A gated call left shut by a failed test ends after this (a hang guard, no timing)."""


class Gate:
    """``entered`` is set once a gated call blocks its worker thread; ``open`` ends it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def open(self) -> None:
        self.opened.set()

    def block(self) -> None:
        self.entered.set()
        self.opened.wait(GATE_GUARD_S)


async def _act(config: dict[str, Any], gate: Gate) -> None:
    if config.get("delay_s"):
        await asyncio.sleep(float(config["delay_s"]))
    if config.get("gated"):
        await asyncio.to_thread(gate.block)
    if config.get("fail"):
        raise RuntimeError("scripted engine failure")


class ScriptedSpeechEngine(SpeechEngine):
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.calls: list[tuple[str, str]] = []
        self.gate = Gate()

    async def start(self) -> SpeechEngineInfo:
        return SpeechEngineInfo(
            voices={v: f"scripted-{v}" for v in SPEC_VOICES},
            sample_rate=SCRIPTED_RATE,
            emotion_tags=bool(self.config.get("emotion_tags", False)),
        )

    async def synthesize(self, text: str, voice: str) -> SynthesizedAudio:
        self.calls.append((text, voice))
        await _act(self.config, self.gate)
        seconds = 0.05 * max(1, len(text.split()))
        t = np.arange(int(seconds * SCRIPTED_RATE), dtype=np.float32) / SCRIPTED_RATE
        samples: npt.NDArray[np.float32] = (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
        return SynthesizedAudio(samples=samples, sample_rate=SCRIPTED_RATE)


class ScriptedTranscriptionEngine(TranscriptionEngine):
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.calls: list[tuple[int, TranscriptionOptions]] = []
        self.gate = Gate()

    async def start(self) -> TranscriptionEngineInfo:
        return TranscriptionEngineInfo(sample_rate=SCRIPTED_RATE)

    async def transcribe(
        self, samples: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> Transcript:
        self.calls.append((int(samples.size), options))
        await _act(self.config, self.gate)
        text = str(self.config.get("text", "scripted transcript"))
        seconds = samples.size / SCRIPTED_RATE
        segment = TranscriptSegment(id=0, start=0.0, end=seconds, text=text)
        return Transcript(text=text, language="en", segments=[segment])


registry.register("speech", "scripted-speech", ScriptedSpeechEngine)
registry.register("transcription", "scripted-transcription", ScriptedTranscriptionEngine)
