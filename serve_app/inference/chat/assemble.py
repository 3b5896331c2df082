"""Turning head events into chat/legacy response bodies and stream chunks.

The wire shapes are the protocol's (``serve_app.protocol.chat``,
``completions``), written once and serialized once, straight to bytes. A
non-streamed answer is collected into ``ChoiceState`` objects, one per choice,
and becomes a ``ChatCompletion``/``Completion`` model. Stream chunks are on the
hot path (one per token), so they are the protocol's TypedDicts serialized by a
``TypeAdapter`` built once per type: cheaper than a model instance per token and
than ``json.dumps``. Both write the same bytes as the plain-dict code they
replaced (``tests/unit/inference/test_wire_bytes.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, cast

from pydantic import TypeAdapter

from serve_app.catalog.config import CatalogModel
from serve_app.contract.chat import (
    GenerationDone,
    HeadEvent,
    TextDelta,
    ToolCallDelta,
    merge_logprobs,
    merge_tool_call,
)
from serve_app.inference.answers import Body
from serve_app.inference.sse import sse_frame
from serve_app.protocol.chat import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    ChunkDelta,
    ChunkFunction,
    ToolCall,
    ToolCallChunk,
    ToolCallFunction,
)
from serve_app.protocol.common import Usage
from serve_app.protocol.completions import (
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionChunkChoice,
)
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
    """docs/reference/chat.md#usage: ``reasoning_tokens`` only on separate-channel models (an
    external provider may report ``reasoning_tokens: 0`` for every model; that is not ours to
    publish), and only when counted (never a made-up 0)."""
    return Usage.build(
        done.prompt_tokens,
        done.completion_tokens,
        done.cached_tokens,
        done.reasoning_tokens if separate_channel else None,
    )


def json_answer(body: ChatCompletion | Completion, headers: dict[str, str]) -> Body:
    """A non-streamed answer, serialized by its model straight to bytes."""
    return Body(body.__pydantic_serializer__.to_json(body), headers)


def chat_completion_body(
    request_id: str, model: str, collected: Collected, n_choices: int, separate_channel: bool
) -> ChatCompletion:
    assert collected.done is not None
    choices = []
    for index in range(n_choices):
        state = collected.choices.get(index) or ChoiceState(index)
        message = AssistantMessage(content="".join(state.text))
        if separate_channel:
            message.reasoning_content = message.reasoning = "".join(state.reasoning)
        if state.tool_calls:
            message.tool_calls = [
                ToolCall(id=c.id, function=ToolCallFunction(name=c.name, arguments=c.arguments))
                for c in state.tool_calls
            ]
            message.content = message.content or None
        choices.append(
            ChatChoice(
                index=index,
                message=message,
                finish_reason=state.finish_reason or "stop",
                logprobs=merge_logprobs(state.logprobs),
            )
        )
    return ChatCompletion(
        id=request_id,
        created=int(time.time()),
        model=model,
        choices=choices,
        usage=usage_of(collected.done, separate_channel),
    )


def completion_body(
    request_id: str, model: str, collected: Collected, n_choices: int, separate_channel: bool
) -> Completion:
    assert collected.done is not None
    choices = []
    for index in range(n_choices):
        state = collected.choices.get(index) or ChoiceState(index)
        choices.append(
            CompletionChoice(
                index=index,
                text="".join(state.text),
                finish_reason=state.finish_reason or "stop",
                logprobs=merge_logprobs(state.logprobs),
            )
        )
    return Completion(
        id=request_id,
        created=int(time.time()),
        model=model,
        choices=choices,
        usage=usage_of(collected.done, separate_channel),
    )


_CHAT_CHUNK = TypeAdapter(ChatCompletionChunk)
_COMPLETION_CHUNK = TypeAdapter(CompletionChunk)

ChunkT = TypeVar("ChunkT", ChatCompletionChunk, CompletionChunk)
ChoiceT = TypeVar("ChoiceT", ChunkChoice, CompletionChunkChoice)


def _tool_call_fragment(call: ToolCallDelta) -> ToolCallChunk:
    """A streamed fragment: id, type and name only on a call's first fragment."""
    if not call.id and not call.name:
        return {"index": call.index, "function": {"arguments": call.arguments}}
    function: ChunkFunction = {"name": call.name, "arguments": call.arguments}
    return {"index": call.index, "id": call.id, "type": "function", "function": function}


class _Chunker(Generic[ChunkT, ChoiceT]):
    """What both routes' chunkers share: the chunk envelope, its serializer, the
    usage and routing chunks. Subclasses name the ``object`` and the adapter."""

    object_name: ClassVar[str]
    adapter: ClassVar[TypeAdapter[Any]]

    def __init__(self, request_id: str, model: str, separate_channel: bool) -> None:
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.separate_channel = separate_channel

    def _chunk(self, choices: list[ChoiceT]) -> ChunkT:
        return cast(
            ChunkT,
            {
                "id": self.request_id,
                "object": self.object_name,
                "created": self.created,
                "model": self.model,
                "choices": choices,
            },
        )

    def _frame(self, chunk: ChunkT) -> bytes:
        return sse_frame(self.adapter.dump_json(chunk, ensure_ascii=True))

    def _extension(self, key: str, value: Any) -> bytes:
        """A chunk with no choices carrying one top-level field (usage, routing, ...)."""
        chunk = cast(dict[str, Any], self._chunk([]))
        chunk[key] = value
        return self._frame(cast(ChunkT, chunk))

    def usage(self, done: GenerationDone) -> bytes:
        return self._extension("usage", usage_of(done, self.separate_channel))

    def routing(self, routing: dict[str, Any]) -> bytes:
        """The disclosure chunk of an externally served stream
        (docs/reference/common.md#external-models)."""
        return self._extension("routing", routing)


class ChatChunker(_Chunker[ChatCompletionChunk, ChunkChoice]):
    """The ``chat.completion.chunk`` SSE frames of one stream."""

    object_name = "chat.completion.chunk"
    adapter = _CHAT_CHUNK

    def role(self, n_choices: int) -> bytes:
        return self._frame(
            self._chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                    }
                    for i in range(n_choices)
                ]
            )
        )

    def delta(self, delta: TextDelta) -> bytes | None:
        body: ChunkDelta = {}
        if delta.text:
            body["content"] = delta.text
        if delta.reasoning and self.separate_channel:
            body["reasoning_content"] = delta.reasoning
            body["reasoning"] = delta.reasoning
        if delta.tool_calls:
            body["tool_calls"] = [_tool_call_fragment(c) for c in delta.tool_calls]
        if not body and delta.finish_reason is None and not delta.logprobs:
            return None
        choice: ChunkChoice = {
            "index": delta.choice_index,
            "delta": body,
            "finish_reason": delta.finish_reason,
        }
        if delta.logprobs:
            choice["logprobs"] = delta.logprobs
        return self._frame(self._chunk([choice]))

    def web_search(self, activity: dict[str, Any]) -> bytes:
        """The tool loop's extension chunk: a tool call about to run, or ``done``
        (docs/reference/chat.md#streams)."""
        return self._extension("web_search", activity)

    def annotations(self, annotations: list[dict[str, Any]]) -> bytes:
        """The tool loop's ``delta.annotations`` chunk, just before the finish
        (docs/reference/chat.md#streams)."""
        choice: ChunkChoice = {
            "index": 0,
            "delta": {"annotations": annotations},
            "finish_reason": None,
        }
        return self._frame(self._chunk([choice]))


class CompletionChunker(_Chunker[CompletionChunk, CompletionChunkChoice]):
    """The ``text_completion`` SSE frames of one stream (legacy route)."""

    object_name = "text_completion"
    adapter = _COMPLETION_CHUNK

    def role(self, n_choices: int) -> None:
        return None

    def delta(self, delta: TextDelta) -> bytes | None:
        if not delta.text and delta.finish_reason is None and not delta.logprobs:
            return None
        choice: CompletionChunkChoice = {
            "index": delta.choice_index,
            "text": delta.text,
            "finish_reason": delta.finish_reason,
            "logprobs": delta.logprobs,
        }
        return self._frame(self._chunk([choice]))
