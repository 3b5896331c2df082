"""GPU speech backend: an Orpheus-style TTS (a Llama LM emitting SNAC codes) on vLLM.

The language model (canopylabs/orpheus-3b-0.1-ft in production) reads
``"<voice>: <text>"`` between Orpheus's control tokens and writes audio as
``<custom_token_N>`` tokens, seven per SNAC frame; the 24 kHz SNAC codec
(hubertsiuzdak/snac_24khz) turns the frames into samples. Emotion tags such as
``<laugh>`` are part of the text the model was trained on, so they are kept.

Generation reuses the chat heads' ``VLLMEngine`` (the same AsyncLLM setup, CPU
or CUDA) through its ``TextEngine`` interface; long inputs are split at
sentence ends and the pieces are generated concurrently, so vLLM batches them.
vLLM, torch and snac are imported lazily: CPU boxes never load this module's
runtime, and the pure functions below are unit-tested without it.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from deployments.audio.base import (
    OUTPUT_SAMPLE_RATE,
    SpeechEngine,
    SpeechEngineInfo,
    SynthesizedAudio,
)
from deployments.chat.vllm_config import VLLMEngineConfig
from serve_app.contract.audio import SPEC_VOICES
from serve_app.contract.chat import PromptSpec, SamplingSpec, TextDelta

START_OF_HUMAN = 128259
END_OF_PROMPT = (128009, 128260, 128261, 128257)
"""Orpheus's control tokens: end of text, end of human turn, start of AI, start of speech."""
END_OF_SPEECH = 128258
CODEBOOK_SIZE = 4096
TOKENS_PER_FRAME = 7
_CUSTOM_TOKEN = re.compile(r"<custom_token_(\d+)>")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class OrpheusConfig(BaseModel):
    """Settings of ``backend: orpheus``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vllm: VLLMEngineConfig = Field(description="The language model's vLLM engine settings.")
    snac_model: str = Field(
        default="hubertsiuzdak/snac_24khz", description="SNAC 24 kHz codec: hub id or folder."
    )
    snac_device: Literal["auto", "cuda", "cpu"] = Field(
        default="auto", description="Where the codec runs; auto: cuda when available."
    )
    temperature: float = Field(default=0.6, ge=0, le=2)
    top_p: float = Field(default=0.8, gt=0, le=1)
    repetition_penalty: float = Field(default=1.3, gt=0, description="Orpheus needs >= 1.1.")
    max_tokens_per_chunk: int = Field(
        default=2400, ge=70, description="Audio tokens per text chunk (~82 per second)."
    )
    chunk_chars: int = Field(
        default=300, ge=20, description="Longest text piece generated as one prompt."
    )


def custom_token_numbers(text: str) -> list[int]:
    """The N of every ``<custom_token_N>`` in generated text, in order."""
    return [int(n) for n in _CUSTOM_TOKEN.findall(text)]


def frames_from_numbers(numbers: list[int]) -> list[list[int]]:
    """Custom-token numbers -> complete 7-code SNAC frames.

    The k-th audio token encodes ``N = code + 10 + (k % 7) * 4096``; tokens whose
    code falls outside the codebook are skipped (as Orpheus's reference decoder
    does) and a trailing partial frame is dropped.
    """
    codes: list[int] = []
    for number in numbers:
        code = number - 10 - (len(codes) % TOKENS_PER_FRAME) * CODEBOOK_SIZE
        if 0 <= code < CODEBOOK_SIZE:
            codes.append(code)
    usable = len(codes) - len(codes) % TOKENS_PER_FRAME
    return [codes[i : i + TOKENS_PER_FRAME] for i in range(0, usable, TOKENS_PER_FRAME)]


def snac_layers(frames: list[list[int]]) -> tuple[list[int], list[int], list[int]]:
    """Frames -> SNAC's three code layers (1, 2 and 4 codes per frame)."""
    coarse: list[int] = []
    middle: list[int] = []
    fine: list[int] = []
    for f in frames:
        coarse.append(f[0])
        middle.extend((f[1], f[4]))
        fine.extend((f[2], f[3], f[5], f[6]))
    return coarse, middle, fine


def decode_frames(snac_model: Any, frames: list[list[int]], device: str) -> Any:
    """SNAC-decode frames to a float32 numpy array at 24 kHz (blocking; run in a thread)."""
    import numpy as np
    import torch

    if not frames:
        return np.zeros(0, np.float32)
    layers = [
        torch.tensor(layer, dtype=torch.int32, device=device).unsqueeze(0)
        for layer in snac_layers(frames)
    ]
    with torch.inference_mode():
        audio = snac_model.decode(layers)
    return audio.squeeze().float().cpu().numpy().astype(np.float32)


def split_text(text: str, max_chars: int) -> list[str]:
    """Sentence-sized pieces of at most ``max_chars`` (a longer sentence is cut at spaces)."""
    pieces: list[str] = []
    current = ""
    for sentence in _SENTENCE_END.split(text.strip()):
        while len(sentence) > max_chars:
            cut = sentence.rfind(" ", 0, max_chars)
            cut = cut if cut > 0 else max_chars
            pieces.extend(p for p in (current, sentence[:cut].strip()) if p)
            current, sentence = "", sentence[cut:].strip()
        if current and len(current) + 1 + len(sentence) > max_chars:
            pieces.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}".strip()
    if current:
        pieces.append(current)
    return pieces


class OrpheusSpeechEngine(SpeechEngine):
    """``SpeechEngine`` over vLLM (the LM) and SNAC (the codec)."""

    def __init__(self, config: OrpheusConfig) -> None:
        from deployments.chat.vllm_engine import VLLMEngine

        self.config = config
        self._lm = VLLMEngine(config.vllm)
        self._snac: Any = None
        self._device = "cpu"

    async def start(self) -> SpeechEngineInfo:
        await self._lm.start()
        self._snac, self._device = await asyncio.to_thread(self._load_snac)
        return SpeechEngineInfo(
            voices={v: v for v in SPEC_VOICES}, sample_rate=OUTPUT_SAMPLE_RATE, emotion_tags=True
        )

    def _load_snac(self) -> tuple[Any, str]:
        import torch
        from snac import SNAC

        device = self.config.snac_device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return SNAC.from_pretrained(self.config.snac_model).eval().to(device), device

    async def synthesize(self, text: str, voice: str) -> SynthesizedAudio:
        import numpy as np

        pieces = split_text(text, self.config.chunk_chars)
        frames = await asyncio.gather(*(self._generate_frames(p, voice) for p in pieces))
        audio = [
            await asyncio.to_thread(decode_frames, self._snac, piece, self._device)
            for piece in frames
        ]
        samples = np.concatenate(audio) if audio else np.zeros(0, np.float32)
        return SynthesizedAudio(samples=samples, sample_rate=OUTPUT_SAMPLE_RATE)

    async def _generate_frames(self, text: str, voice: str) -> list[list[int]]:
        sampling = SamplingSpec(
            max_tokens=self.config.max_tokens_per_chunk,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            extra={
                "repetition_penalty": self.config.repetition_penalty,
                "stop_token_ids": [END_OF_SPEECH],
                "skip_special_tokens": False,
            },
        )
        text_only = await self._lm.prepare(
            PromptSpec(kind="completion", prompt=f"{voice}: {text}"), sampling
        )
        ids = [START_OF_HUMAN, *text_only.token_ids, *END_OF_PROMPT]
        prompt = await self._lm.prepare(PromptSpec(kind="completion", token_ids=ids), sampling)
        generated: list[str] = []
        async for event in self._lm.generate(f"orpheus-{uuid.uuid4().hex}", prompt, sampling):
            if isinstance(event, TextDelta):
                generated.append(event.text)
        return frames_from_numbers(custom_token_numbers("".join(generated)))

    async def check_health(self) -> None:
        await self._lm.check_health()

    async def shutdown(self) -> None:
        await self._lm.shutdown()
