"""Wire format of ``POST /v1/chat/completions`` (spec 2.4, 2.5, 4.1, 6)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from serve_app.protocol.common import JsonInt, SamplingFields, Usage
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
    """Request body. Unknown fields are relayed to the engine (spec 4.1)."""

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
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None
    annotations: list[dict[str, Any]] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    routing: dict[str, Any] | None = None
    web_search: dict[str, Any] | None = None


class ToolCallChunk(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str] | None = None


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallChunk] | None = None
    annotations: list[dict[str, Any]] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE event. Dumped with ``exclude_none`` except ``choices`` and ``finish_reason``."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
