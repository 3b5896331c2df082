"""Wire format of ``POST /v1/chat/completions`` (docs/reference/chat.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, Required

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from typing_extensions import TypedDict

from serve_app.protocol.common import JsonInt, SamplingFields, Usage, absent_if_none
from serve_app.protocol.tool_schemas import CHAT_FUNCTION_TOOL, tools_schema

Role = Literal["system", "user", "assistant", "tool"]


class ImageURL(BaseModel):
    model_config = ConfigDict(extra="allow")

    url: str = Field(min_length=1, description="data: URI or http(s) URL.")
    detail: str | None = None


class ContentPart(BaseModel):
    """One part of a multi-part message: text or an image; others are relayed."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None
    image_url: ImageURL | None = None


class ChatMessage(BaseModel):
    """A message; extra keys (e.g. ``reasoning_content`` echoed back) are relayed."""

    model_config = ConfigDict(extra="allow")

    role: Role = Field(description="system, user, assistant or tool; others are a 400.")
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(SamplingFields):
    """Request body. Unknown fields are relayed to the engine
    (docs/reference/chat.md#chat-request)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: JsonInt | None = Field(default=None, ge=1)
    tools: Annotated[
        list[dict[str, Any]] | None, WithJsonSchema(tools_schema(CHAT_FUNCTION_TOOL))
    ] = None
    tool_choice: str | dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    reasoning_effort: str | None = None

    def requested_max_tokens(self) -> tuple[int | None, str]:
        """The effective cap and the field to name in errors (the newer one wins)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class ToolCallFunction(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class AssistantMessage(BaseModel):
    """The answer's message; ``reasoning_content``/``reasoning`` only on models with a
    separate reasoning channel, ``annotations`` only with server tools (docs/reference/chat.md)."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = Field(default=None, exclude_if=absent_if_none)
    reasoning: str | None = Field(default=None, exclude_if=absent_if_none)
    tool_calls: list[ToolCall] | None = Field(default=None, exclude_if=absent_if_none)
    annotations: list[dict[str, Any]] | None = Field(default=None, exclude_if=absent_if_none)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class ChatCompletion(BaseModel):
    """The non-streamed answer; ``web_search`` and ``routing`` only when they apply."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    web_search: dict[str, Any] | None = Field(default=None, exclude_if=absent_if_none)
    routing: dict[str, Any] | None = Field(default=None, exclude_if=absent_if_none)


# Stream chunks are TypedDicts, not models: one is built per token, and a dict
# checked by mypy and serialized by a cached ``TypeAdapter`` costs less than a model
# instance (``serve_app.inference.chat.assemble``). A key not written is not sent; a key
# written as ``None`` is ``null`` (``finish_reason`` always is, until the last chunk).


class ChunkFunction(TypedDict, total=False):
    name: str
    arguments: Required[str]


class ToolCallChunk(TypedDict):
    """A streamed call fragment: ``id``, ``type`` and ``name`` only on a call's first."""

    index: int
    id: NotRequired[str]
    type: NotRequired[Literal["function"]]
    function: ChunkFunction


class ChunkDelta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str
    reasoning_content: str
    reasoning: str
    tool_calls: list[ToolCallChunk]
    annotations: list[dict[str, Any]]


class ChunkChoice(TypedDict):
    index: int
    delta: ChunkDelta
    finish_reason: str | None
    logprobs: NotRequired[dict[str, Any]]


class ChatCompletionChunk(TypedDict):
    """One SSE event. ``usage`` (the usage chunk), ``routing`` (an external model's
    disclosure, docs/reference/common.md#external-models) and ``web_search`` (the tool loop's
    extension chunks, docs/reference/chat.md#streams) come with ``choices: []``."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: NotRequired[Usage]
    routing: NotRequired[dict[str, Any]]
    web_search: NotRequired[dict[str, Any]]
