"""The text-generation engine contract shared by every chat head backend.

A head deployment (``deployments.chat_head``) owns one ``TextEngine`` that it
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
   DeploymentHandle unchanged.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

PromptKind = Literal["chat", "completion"]


@dataclass
class SamplingSpec:
    """Sampling parameters after the gateway's validation and translation."""

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Unknown request fields relayed as given (spec 4.1: relayed to the engine)."""


@dataclass
class PromptSpec:
    """What to render: chat messages or one raw completion prompt."""

    kind: PromptKind
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    token_ids: list[int] | None = None
    """A completion prompt given as token ids (OpenAI allows it; Orpheus builds its own)."""
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class PreparedPrompt:
    """A rendered, tokenized prompt; ``payload`` is backend-specific (e.g. images)."""

    token_ids: list[int]
    payload: Any = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class ToolCallDelta:
    """A client function call extracted from the model's output."""

    id: str
    name: str
    arguments: str
    index: int = 0


def merge_tool_call(calls: list[ToolCallDelta], fragment: ToolCallDelta) -> int:
    """Add a streamed fragment to the calls gathered so far (OpenAI's delta rules).

    A fragment with the index of an earlier call and no new id or name continues
    that call's arguments; anything else starts a new call. ``calls`` holds copies,
    so the fragments (which may be relayed as they are) are never changed.
    Returns the position in ``calls`` of the call the fragment belongs to.
    """
    position = next(
        (i for i in range(len(calls) - 1, -1, -1) if calls[i].index == fragment.index), None
    )
    if position is not None and not fragment.name and fragment.id in ("", calls[position].id):
        calls[position].arguments += fragment.arguments
        return position
    calls.append(dataclasses.replace(fragment))
    return len(calls) - 1


@dataclass
class TextDelta:
    """New output for one choice."""

    choice_index: int
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    """Tokens generated for this choice so far (cumulative), for partial billing."""
    logprobs: Any = None
    """This delta's logprobs in OpenAI's shape for the route (chat: ``{"content": [...]}``;
    completions: ``{"tokens": [...], "token_logprobs": [...], ...}``), or None."""


@dataclass
class GenerationDone:
    """Final accounting for one ``generate`` call."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None

    def add(self, other: GenerationDone) -> None:
        """Fold another generation's accounting into this one (prompts, turns).

        Optional counts stay ``None`` until some part reports them, so a total
        never shows a made-up 0 (spec 2.7).
        """
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        if other.cached_tokens is not None:
            self.cached_tokens = (self.cached_tokens or 0) + other.cached_tokens
        if other.reasoning_tokens is not None:
            self.reasoning_tokens = (self.reasoning_tokens or 0) + other.reasoning_tokens


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

    async def abort(self, request_id: str) -> None:
        """Stop a running request (client went away). Default: nothing to stop."""
        return None

    async def check_health(self) -> None:
        """Raise when the engine can no longer serve."""
        return None

    async def shutdown(self) -> None:
        """Release the model; called when the replica stops."""
        return None
