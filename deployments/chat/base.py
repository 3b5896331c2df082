"""The text-generation engine contract shared by every chat head backend.

A head deployment (``deployments.chat.head``) owns one ``TextEngine`` that it
receives from a factory, never constructs itself: the vLLM backend on CPU or
GPU in production, a scripted engine in tests of the gateway's own logic.

Streaming contract (read this before writing a backend):

1. ``prepare`` renders the prompt (chat template applied) and tokenizes it
   once, with the request's sampling at hand (a backend may validate both).
   The head reads ``num_tokens`` for ``context_length_exceeded`` and to
   size ``max_tokens`` when the caller omitted it, *before* anything is
   generated, then hands the same ``PreparedPrompt`` to ``generate``.
2. ``generate`` yields ``TextDelta`` items, then exactly one ``GenerationDone``.
   Deltas carry only new text. ``tool_calls`` follow OpenAI's streaming
   semantics: entries with the same ``index`` are one call, the first fragment
   carries ``id`` and ``name``, later ones only more ``arguments``.
   ``choice_index`` runs 0..n-1 for one prompt.
   ``finish_reason`` is set on the last delta of a choice ("stop", "length",
   "tool_calls", "content_filter").
3. Failure before the first delta: raise. Failure after it: raise as well; the
   head turns it into an error event and bills what was produced.
4. Everything yielded is a plain dataclass of builtins so it crosses a Ray
   DeploymentHandle unchanged: the request and result values live in the neutral
   contract (``serve_app.contract.chat``), which the gateway imports as well.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from serve_app.contract.adapters import BaseShapes, LoraSettings
from serve_app.contract.chat import GenerationDone, PromptSpec, SamplingSpec, TextDelta
from serve_app.contract.errors import InvalidRequestError


@dataclass
class PreparedPrompt:
    """A rendered, tokenized prompt; ``payload`` is backend-specific (e.g. images)."""

    token_ids: list[int]
    payload: Any = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


EngineEvent = TextDelta | GenerationDone


@dataclass
class EngineInfo:
    """Facts about the loaded model that the head needs for its guardrails."""

    max_model_len: int
    separate_reasoning_channel: bool = False
    sampling_defaults: dict[str, float] = field(default_factory=dict)
    """Sampling values the engine applies when a request omits them, where they differ
    from OpenAI's (vLLM: the model's ``generation_config``), so a response can state the
    temperature and top_p it was really sampled with."""


class TextEngine(abc.ABC):
    """A text generator bound to one loaded model."""

    @abc.abstractmethod
    async def start(self) -> EngineInfo:
        """Load the model; called once by the head before it reports healthy."""

    @abc.abstractmethod
    async def prepare(self, prompt: PromptSpec, sampling: SamplingSpec) -> PreparedPrompt:
        """Render and tokenize; raise ``InvalidRequestError`` for unrenderable input."""

    @abc.abstractmethod
    def generate(
        self,
        request_id: str,
        prompt: PreparedPrompt,
        sampling: SamplingSpec,
        *,
        stream: bool = True,
    ) -> AsyncIterator[EngineEvent]:
        """Stream deltas then one ``GenerationDone`` (see the module docstring).

        ``stream=False`` allows one whole delta per choice (nobody reads tokens early).
        """

    def supported_extra_params(self) -> frozenset[str]:
        """Names of unknown request fields this backend honours when relayed.

        The head drops the rest and reports them in ``x-service-ignored-params``
        instead of letting them vanish silently.
        """
        return frozenset()

    def lora_settings(self) -> LoraSettings | None:
        """The engine's LoRA bounds where it serves adapters (vLLM: its ``lora`` config)."""
        return None

    def adapter_base(self) -> BaseShapes | None:
        """The base model's layers as adapters see them (uploads are checked against
        them); None where the engine cannot tell (then no upload is accepted)."""
        return None

    async def load_adapter(self, lora_name: str, path: str) -> None:
        """Load the LoRA adapter in folder ``path`` as ``lora_name`` (the adapter's unique
        id, ``AdapterRef.key``; ``PromptSpec.adapter`` names it).

        Default: this backend serves no adapters (the gateway never sends one to a head
        whose engine config lacks ``lora``)."""
        raise InvalidRequestError("This model is served without LoRA adapters.")

    async def unload_adapter(self, lora_name: str) -> None:
        """Drop a loaded adapter. Default: nothing was loaded."""
        return None

    async def abort(self, request_id: str) -> None:
        """Stop a running request (client went away). Default: nothing to stop."""
        return None

    async def check_health(self) -> None:
        """Raise when the engine can no longer serve."""
        return None

    async def shutdown(self) -> None:
        """Release the model; called when the replica stops."""
        return None
