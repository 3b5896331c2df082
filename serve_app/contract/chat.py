"""Values a text head and the gateway exchange over a DeploymentHandle.

Only plain dataclasses cross a handle (never a Starlette request), so the head
can run in another process, on another node, or in-process in tests. A head
stream is: one ``HeadStarted`` (or one ``HeadFailure``), then ``TextDelta``
items, then ``GenerationDone``; a ``HeadFailure`` may replace any later item
when the engine breaks mid-stream.

The request side (``SamplingSpec``, ``PromptSpec``) is what the gateway builds
after validation; the result side (``TextDelta``, ``ToolCallDelta``,
``GenerationDone``) is also what every ``TextEngine`` yields
(``deployments.chat.base`` states the streaming rules engines follow).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from serve_app.contract.adapters import AdapterRef
from serve_app.contract.errors import HeadFailure

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
    """Unknown request fields relayed as given (docs/reference/chat.md#chat-request: relayed to the
    engine)."""


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
    adapter: str | None = None
    """Set by the head, never the gateway: the LoRA adapter to generate with, by its unique
    id (``AdapterRef.key``, its name in the engine; never ``<base>:<name>``, which another
    organization may use too); None: the base model."""


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


def merge_logprobs(parts: list[Any]) -> dict[str, Any] | None:
    """Per-delta logprobs objects -> one (lists joined key by key), or None if none came.

    One rule for every place deltas are joined: the head's stream batching and the
    gateway's assembly of a whole answer.

    The chat shape is ``{"content": [...], "refusal": ...}``; the legacy one has
    ``tokens``, ``token_logprobs``, ``top_logprobs`` and ``text_offset`` lists.
    """
    if not parts:
        return None
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)
            else:
                merged.setdefault(key, value)
    return merged


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
        never shows a made-up 0 (docs/reference/chat.md#usage).
        """
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        if other.cached_tokens is not None:
            self.cached_tokens = (self.cached_tokens or 0) + other.cached_tokens
        if other.reasoning_tokens is not None:
            self.reasoning_tokens = (self.reasoning_tokens or 0) + other.reasoning_tokens


@dataclass
class HeadRequest:
    """A validated generation request for one model.

    ``max_tokens`` is ``None`` when the caller omitted it: the head then uses
    the remaining window, capped by ``max_output_tokens``. ``prompts`` has one
    entry for chat, one per prompt for legacy completions.
    """

    request_id: str
    prompts: list[PromptSpec]
    sampling: SamplingSpec
    max_tokens: int | None
    max_tokens_param: str
    max_output_tokens: int
    prompt_param: str = "messages"
    stream: bool = True
    """False: the head may answer with one whole result per choice instead of a token
    stream (a non-streamed call without server tools: nothing to relay early)."""
    adapter: AdapterRef | None = None
    """The LoRA adapter to generate with (docs/reference/adapters.md); None: the base model."""
    org_id: str | None = None
    """The caller's organization, set by the gateway: the chat head's prefix router keys
    its entries by it (deployments/chat/prefix_router.py), so organizations never share them."""


@dataclass
class HeadStarted:
    """The prompt was accepted; generation begins."""

    prompt_tokens: int
    max_tokens: int
    ignored_params: list[str] = field(default_factory=list)
    sampling_defaults: dict[str, float] = field(default_factory=dict)
    """``EngineInfo.sampling_defaults``: what applies to a sampling value the request omits."""


HeadEvent = HeadStarted | HeadFailure | TextDelta | GenerationDone
