"""Wire format of Anthropic's Messages API: ``POST /v1/messages`` (docs/reference/messages.md).

The shapes follow Anthropic's published API and vLLM's own Anthropic layer
(``vllm/entrypoints/anthropic/protocol.py``), which is not imported: it pulls torch
and the whole of vLLM (about 640 MB resident) into a gateway replica that otherwise
holds under 100 MB; ``tests/unit/messages/test_vllm_parity.py`` holds the
translation to it instead. Unknown fields are kept (``extra="allow"``) so that the
service can name them in ``x-service-ignored-params`` rather than drop them.

Errors on these routes use Anthropic's envelope, not the OpenAI one
(``anthropic_envelope``): ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from serve_app.protocol.common import JsonBool, JsonFloat, JsonInt, first_unencodable
from serve_app.protocol.errors import GatewayError

MESSAGES_PATH = "/v1/messages"
"""The prefix of the family's routes; the error mapper answers Anthropic's envelope under it."""

BETAS_HEADER = "x-service-ignored-betas"
"""Response header naming ``anthropic-beta`` values the gateway does not act on."""

BlockType = Literal["text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"]


class ContentBlock(BaseModel):
    """One block of a message (docs/reference/messages.md#content-blocks).

    ``cache_control`` is accepted on any block: prefix caching is the engine's own, so
    it needs no marker (its cached tokens come back as ``cache_read_input_tokens``).
    """

    model_config = ConfigDict(extra="allow")

    type: BlockType
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: JsonBool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    cache_control: dict[str, Any] | None = None


class SystemBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


class MessageParam(BaseModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(BaseModel):
    """A client tool. Anthropic's server tools (a ``type`` such as ``web_search_20250305``)
    are refused by the service, not taken for client tools."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    """Required of a client tool (checked with its ``type``)."""
    type: str | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(BaseModel):
    """``name`` is required with ``type: tool``; the service checks it (after the model is
    resolved, as every rule that the published schema cannot state)."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: JsonBool | None = None


class Thinking(BaseModel):
    """``thinking``: ``enabled`` (with ``budget_tokens``), ``adaptive`` or ``disabled``."""

    model_config = ConfigDict(extra="allow")

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: JsonInt | None = Field(default=None, ge=1024)


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    user_id: str | None = Field(default=None, max_length=256)


class _Conversation(BaseModel):
    """What ``/v1/messages`` and ``/v1/messages/count_tokens`` share."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, description="Catalog id of a chat model.")
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[SystemBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    def unencodable_field(self) -> str | None:
        """As on chat (``SamplingFields.unencodable_field``): the first text that is not valid
        Unicode, field names included, as a ``param`` path."""
        return first_unencodable(self.model_dump(exclude_unset=True))


class MessagesRequest(_Conversation):
    """Request body of ``POST /v1/messages`` (docs/reference/messages.md#request)."""

    max_tokens: JsonInt = Field(ge=1, description="Cap on generated tokens (required).")
    stop_sequences: list[str] | None = None
    stream: JsonBool = False
    temperature: JsonFloat | None = Field(default=None, ge=0, le=1)
    top_p: JsonFloat | None = Field(default=None, gt=0, le=1)
    top_k: JsonInt | None = Field(default=None, ge=1)
    metadata: Metadata | None = None


class CountTokensRequest(_Conversation):
    """Request body of ``POST /v1/messages/count_tokens``."""


class MessagesUsage(BaseModel):
    """``input_tokens`` excludes the prompt tokens read from the engine's prefix cache,
    which are ``cache_read_input_tokens`` (Anthropic's split; the ledger keeps the sum)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessageResponse(BaseModel):
    """The non-streamed answer (and, empty, the ``message_start`` event's message)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessagesUsage


class CountTokensResponse(BaseModel):
    input_tokens: int


class AnthropicErrorBody(BaseModel):
    type: str
    message: str


class AnthropicErrorEnvelope(BaseModel):
    """The body of every non-2xx answer on ``/v1/messages`` routes."""

    type: Literal["error"] = "error"
    error: AnthropicErrorBody


_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_type(status_code: int) -> str:
    """Anthropic's error type for a status (docs/reference/messages.md#errors)."""
    if status_code in _TYPE_BY_STATUS:
        return _TYPE_BY_STATUS[status_code]
    return "invalid_request_error" if status_code < 500 else "api_error"


def anthropic_envelope(err: GatewayError) -> dict[str, Any]:
    """``err`` in Anthropic's envelope; the gateway's code stays readable in the message."""
    message = err.message
    if err.param and err.param not in message:
        message = f"{err.param}: {message}"
    body = AnthropicErrorBody(type=anthropic_error_type(err.status_code), message=message)
    return AnthropicErrorEnvelope(error=body).model_dump()


def is_messages_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")
