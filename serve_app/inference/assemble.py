"""Turning head events into chat/legacy response bodies and stream chunks.

Non-streamed bodies are collected into ``ChoiceState`` objects, one per
choice; streamed chunks are built as plain dicts because they are on the hot
path (one per token) and their shape is fixed (spec 6).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from serve_app.catalog.config import CatalogModel
from serve_app.contract.text import (
    GenerationDone,
    HeadEvent,
    TextDelta,
    ToolCallDelta,
    merge_tool_call,
)
from serve_app.protocol.common import Usage
from serve_app.protocol.headers import RESIDENCY_HEADER, ignored_params_header


@dataclass
class ChoiceState:
    """Everything produced so far for one choice."""

    index: int
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    logprobs: list[Any] = field(default_factory=list)

    def add(self, delta: TextDelta) -> None:
        if delta.text:
            self.text.append(delta.text)
        if delta.reasoning:
            self.reasoning.append(delta.reasoning)
        for fragment in delta.tool_calls:
            merge_tool_call(self.tool_calls, fragment)
        if delta.logprobs:
            self.logprobs.append(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        self.completion_tokens = max(self.completion_tokens, delta.completion_tokens)


@dataclass
class Collected:
    """A whole generation gathered from the head."""

    choices: dict[int, ChoiceState] = field(default_factory=dict)
    done: GenerationDone | None = None

    def add(self, delta: TextDelta) -> None:
        state = self.choices.get(delta.choice_index)
        if state is None:
            state = self.choices[delta.choice_index] = ChoiceState(delta.choice_index)
        state.add(delta)

    def take(self, event: HeadEvent) -> None:
        """One head event of a non-streamed answer: a delta, or the final counts."""
        if isinstance(event, TextDelta):
            self.add(event)
        elif isinstance(event, GenerationDone):
            self.done = event

    def produced_tokens(self) -> int:
        """Tokens generated so far, for billing a stream that broke."""
        return sum(c.completion_tokens for c in self.choices.values())


def answer_headers(ignored: list[str], model: CatalogModel) -> dict[str, str]:
    """``x-service-ignored-params`` and, for an external model, the residency header;
    the same on chat, completions, responses and the tool loop."""
    headers = ignored_params_header(ignored)
    if model.is_external:
        headers[RESIDENCY_HEADER] = "external"
    return headers


def usage_of(done: GenerationDone, separate_channel: bool) -> Usage:
    """Spec 2.7: ``reasoning_tokens`` only on separate-channel models (an external
    provider may report ``reasoning_tokens: 0`` for every model; that is not ours to
    publish), and only when counted (never a made-up 0)."""
    return Usage.build(
        done.prompt_tokens,
        done.completion_tokens,
        done.cached_tokens,
        done.reasoning_tokens if separate_channel else None,
    )


def chat_completion_body(
    request_id: str, model: str, collected: Collected, n_choices: int, separate_channel: bool
) -> dict[str, Any]:
    assert collected.done is not None
    choices = []
    for index in range(n_choices):
        state = collected.choices.get(index) or ChoiceState(index)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(state.text)}
        if separate_channel:
            reasoning = "".join(state.reasoning)
            message["reasoning_content"] = reasoning
            message["reasoning"] = reasoning
        if state.tool_calls:
            message["tool_calls"] = [_tool_call(c) for c in state.tool_calls]
            if not message["content"]:
                message["content"] = None
        choices.append(
            {
                "index": index,
                "message": message,
                "finish_reason": state.finish_reason or "stop",
                "logprobs": merge_logprobs(state.logprobs),
            }
        )
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_of(collected.done, separate_channel).model_dump(exclude_none=True),
    }


def completion_body(
    request_id: str, model: str, collected: Collected, n_choices: int, separate_channel: bool
) -> dict[str, Any]:
    assert collected.done is not None
    choices = []
    for index in range(n_choices):
        state = collected.choices.get(index) or ChoiceState(index)
        choices.append(
            {
                "index": index,
                "text": "".join(state.text),
                "finish_reason": state.finish_reason or "stop",
                "logprobs": merge_logprobs(state.logprobs),
            }
        )
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_of(collected.done, separate_channel).model_dump(exclude_none=True),
    }


def merge_logprobs(parts: list[Any]) -> dict[str, Any] | None:
    """Per-delta logprobs objects -> one (lists joined key by key), or None if none came.

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


def _tool_call(call: ToolCallDelta) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _tool_call_fragment(call: ToolCallDelta) -> dict[str, Any]:
    """A streamed fragment: id, type and name only on a call's first fragment."""
    if not call.id and not call.name:
        return {"index": call.index, "function": {"arguments": call.arguments}}
    return {"index": call.index, **_tool_call(call)}


class ChatChunker:
    """Builds ``chat.completion.chunk`` dicts for one stream."""

    def __init__(self, request_id: str, model: str, separate_channel: bool) -> None:
        self.base = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        self.separate_channel = separate_channel

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {**self.base, "choices": choices, **extra}

    def role(self, n_choices: int) -> dict[str, Any]:
        return self._chunk(
            [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                for i in range(n_choices)
            ]
        )

    def delta(self, delta: TextDelta) -> dict[str, Any] | None:
        body: dict[str, Any] = {}
        if delta.text:
            body["content"] = delta.text
        if delta.reasoning and self.separate_channel:
            body["reasoning_content"] = delta.reasoning
            body["reasoning"] = delta.reasoning
        if delta.tool_calls:
            body["tool_calls"] = [_tool_call_fragment(c) for c in delta.tool_calls]
        if not body and delta.finish_reason is None and not delta.logprobs:
            return None
        choice = {"index": delta.choice_index, "delta": body, "finish_reason": delta.finish_reason}
        if delta.logprobs:
            choice["logprobs"] = delta.logprobs
        return self._chunk([choice])

    def usage(self, done: GenerationDone) -> dict[str, Any]:
        usage = usage_of(done, self.separate_channel).model_dump(exclude_none=True)
        return self._chunk([], usage=usage)

    def routing(self, routing: dict[str, Any]) -> dict[str, Any]:
        """The disclosure chunk of an externally served stream (spec 2.3)."""
        return self._chunk([], routing=routing)


class CompletionChunker:
    """Builds ``text_completion`` stream chunks (legacy route)."""

    def __init__(self, request_id: str, model: str, separate_channel: bool) -> None:
        self.base = {
            "id": request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        self.separate_channel = separate_channel

    def role(self, n_choices: int) -> None:
        return None

    def delta(self, delta: TextDelta) -> dict[str, Any] | None:
        if not delta.text and delta.finish_reason is None and not delta.logprobs:
            return None
        choice = {
            "index": delta.choice_index,
            "text": delta.text,
            "finish_reason": delta.finish_reason,
            "logprobs": delta.logprobs,
        }
        return {**self.base, "choices": [choice]}

    def usage(self, done: GenerationDone) -> dict[str, Any]:
        usage = usage_of(done, self.separate_channel).model_dump(exclude_none=True)
        return {**self.base, "choices": [], "usage": usage}

    def routing(self, routing: dict[str, Any]) -> dict[str, Any]:
        return {**self.base, "choices": [], "routing": routing}
