"""Wire format of ``POST /v1/responses`` (docs/reference/responses.md).

Unlike chat, the request is closed: an unlisted field is a 400
``unknown_parameter`` (``extra="forbid"``; the error mapper turns pydantic's
``extra_forbidden`` into that code). Input items and tools stay loosely typed
here and are checked by ``serve_app.inference.responses.input`` so every
refusal can name its exact ``param`` (``input[2].content[0].type``).

What the route writes (the Response, its output items and every named stream
event) is TypedDicts: the Response is rebuilt into events as it grows, and one
event is written per token, so a dict checked by mypy and serialized by a
``TypeAdapter`` built once per type (``serve_app.inference.responses.render``)
costs less than a model instance. A key not written is not sent; a key written
as ``None`` is ``null``. The shapes are Open Responses 2026-04-24's, plus the
extensions and deviations docs/api.md lists.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator
from typing_extensions import TypedDict

from serve_app.protocol.tool_schemas import RESPONSES_FUNCTION_TOOL, tools_schema

ResponseStatus = Literal["completed", "incomplete", "failed", "in_progress"]
ItemStatus = Literal["in_progress", "completed", "incomplete", "failed"]


class ReasoningParam(BaseModel):
    """``reasoning``: ``effort`` switches deliberation; no summary is ever produced."""

    model_config = ConfigDict(extra="forbid")

    effort: str | None = Field(default=None, description="none, minimal, low, medium, high.")
    summary: Literal["auto", "concise", "detailed"] | None = Field(
        default=None,
        description="Accepted and not honoured (no summary is written): named in "
        "x-service-ignored-params.",
    )


Includable = Literal[
    "message.output_text.logprobs",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
]
"""``include`` values the route honours; any other is 400 ``unsupported_parameter``."""
INCLUDABLE: frozenset[str] = frozenset(Includable.__args__)  # type: ignore[attr-defined]


_INPUT_ITEMS = {"type": "array", "items": {"type": "object"}, "minItems": 1}


class ResponsesRequest(BaseModel):
    """Request body; every field of docs/reference/responses.md#request and nothing else."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="Catalog id of a chat model.")
    input: str | Annotated[list[dict[str, Any]], WithJsonSchema(_INPUT_ITEMS)] = Field(
        description="A user turn as a string, or input items (message, function_call, "
        "function_call_output)."
    )
    background: bool | None = Field(default=None, description="Only false (nothing is queued).")
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    include: list[str] | None = Field(
        default=None,
        description="Extra output: message.output_text.logprobs, "
        "web_search_call.action.sources, code_interpreter_call.outputs (always sent).",
    )
    instructions: str | None = Field(default=None, description="Prepended as a system turn.")
    max_output_tokens: int | None = Field(default=None, ge=1, description="Cap on output.")
    metadata: dict[str, Any] | None = Field(default=None, description="Echoed, not stored.")
    parallel_tool_calls: bool | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    previous_response_id: str | None = Field(default=None, description="Must be null.")
    prompt_cache_key: str | None = Field(
        default=None, description="Accepted, not used (prefix caching needs no key)."
    )
    reasoning: ReasoningParam | None = None
    safety_identifier: str | None = Field(default=None, description="Accepted, not used.")
    seed: int | None = None
    service_tier: str | None = Field(
        default=None, description="auto or default; any other is accepted and not honoured."
    )
    store: bool | None = Field(default=None, description="Must be false (stateless route).")
    stream: bool = Field(default=False, description="Answer as named server-sent events.")
    temperature: float | None = Field(default=None, ge=0, le=2)
    text: dict[str, Any] | None = Field(
        default=None,
        description="format: text (json_schema, json_object where the operator allows "
        "them: responses.structured_text_formats); verbosity.",
    )
    tool_choice: str | dict[str, Any] | None = None
    tools: Annotated[
        list[dict[str, Any]] | None, WithJsonSchema(tools_schema(RESPONSES_FUNCTION_TOOL))
    ] = None
    top_logprobs: int | None = Field(
        default=None, ge=0, le=20, description="With include message.output_text.logprobs."
    )
    top_p: float | None = Field(default=None, gt=0, le=1)
    truncation: Literal["auto", "disabled"] | None = Field(
        default=None, description="Always disabled: an over-long input is a 400, never cut."
    )
    user: str | None = Field(default=None, description="End-user id; accepted, not used.")

    @field_validator("input")
    @classmethod
    def _at_least_one_item(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(value, list) and not value:
            raise ValueError("input needs at least one item")
        return value


# -- output items -------------------------------------------------------------


class UrlCitation(TypedDict):
    """A ``[n]`` marker of the answer (``index``: the source number, an extension),
    or an uncited source with an empty span at the end of the text."""

    type: Literal["url_citation"]
    url: str
    title: str
    index: int
    start_index: int
    end_index: int


class TopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TypedDict):
    """One answer token (``include: [message.output_text.logprobs]``), as vLLM wrote it."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class OutputTextPart(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[UrlCitation]
    logprobs: NotRequired[list[TokenLogprob]]


class ReasoningTextPart(TypedDict):
    type: Literal["reasoning_text"]
    text: str


ContentPart = Annotated[OutputTextPart | ReasoningTextPart, Field(discriminator="type")]


class MessageItem(TypedDict):
    """The answer: one ``output_text`` part once it is done (none while it streams)."""

    id: str
    type: Literal["message"]
    status: ItemStatus
    role: Literal["assistant"]
    content: list[OutputTextPart]


class ReasoningItem(TypedDict):
    """Separate-channel reasoning; ``summary`` stays empty
    (docs/reference/responses.md#response-object)."""

    id: str
    type: Literal["reasoning"]
    status: ItemStatus
    summary: list[dict[str, Any]]
    content: list[ReasoningTextPart]


class FunctionCallItem(TypedDict):
    """A client function call, for the client to run."""

    id: str
    type: Literal["function_call"]
    status: ItemStatus
    call_id: str
    name: str
    arguments: str


ServerToolItemType = Literal["web_search_call", "web_fetch_call", "code_interpreter_call"]


class CodeLogs(TypedDict):
    type: Literal["logs"]
    logs: str


class ToolCallError(TypedDict):
    message: str


class ServerToolCallItem(TypedDict):
    """A server-tool call the loop ran (an extension): ``outputs`` on a finished
    code_interpreter call, ``error`` on a failed call."""

    id: str
    type: ServerToolItemType
    status: Literal["in_progress", "completed", "failed"]
    action: dict[str, Any]
    outputs: NotRequired[list[CodeLogs]]
    error: NotRequired[ToolCallError]


OutputItem = Annotated[
    MessageItem | ReasoningItem | FunctionCallItem | ServerToolCallItem,
    Field(discriminator="type"),
]
"""Any item of ``output``; its ``type`` picks the serializer."""


# -- the Response ---------------------------------------------------------------


class InputTokensDetails(TypedDict):
    cached_tokens: int


class OutputTokensDetails(TypedDict):
    reasoning_tokens: int


class ResponseUsage(TypedDict):
    """``input_tokens_details`` always (0 cached when the engine counted none);
    ``output_tokens_details`` only when the engine reported the reasoning split
    (docs/reference/chat.md#usage: never a made-up 0)."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens_details: NotRequired[OutputTokensDetails]


class IncompleteDetails(TypedDict):
    reason: Literal["max_output_tokens", "upstream_error"]


class ResponseError(TypedDict):
    code: str
    message: str


class FunctionToolEcho(TypedDict):
    """A declared function tool, flat, every key of the schema's FunctionTool."""

    type: Literal["function"]
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


ServerToolType = Literal["web_search", "web_fetch", "code_interpreter"]


class ServerToolEcho(TypedDict):
    """A declared server tool with the budget and limits the loop applies."""

    type: ServerToolType
    max_uses: int
    search_context_size: NotRequired[Literal["low", "medium", "high"]]
    timeout_s: NotRequired[float]


ToolEcho = Annotated[FunctionToolEcho | ServerToolEcho, Field(discriminator="type")]


class FunctionToolChoice(TypedDict):
    type: Literal["function"]
    name: str


class TextFormat(TypedDict):
    type: Literal["text", "json_object"]


class JsonSchemaFormat(TypedDict):
    type: Literal["json_schema"]
    name: str
    schema: dict[str, Any]
    description: str | None
    strict: bool | None


TextFormatEcho = TextFormat | JsonSchemaFormat


class TextConfig(TypedDict):
    format: TextFormatEcho


class ReasoningEcho(TypedDict):
    effort: str | None
    summary: None


class ResponseSettings(TypedDict):
    """The ``ResponseResource`` fields stating how the response was generated: what was
    applied, never a null where a value applied (``serve_app.inference.responses.echo``)."""

    instructions: str | None
    tools: Annotated[
        list[ToolEcho],
        Field(description="Function tools flat, then server tools with their applied budgets."),
    ]
    tool_choice: str | FunctionToolChoice
    truncation: Literal["disabled"]
    parallel_tool_calls: bool
    text: TextConfig
    temperature: float
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    top_logprobs: int
    reasoning: ReasoningEcho | None
    max_output_tokens: Annotated[int | None, Field(description="The output cap the head applied.")]
    max_tool_calls: Annotated[
        int | None, Field(description="Sum of the server-tool budgets, if any.")
    ]
    background: Literal[False]
    service_tier: str
    safety_identifier: None
    prompt_cache_key: None


class ResponseResource(ResponseSettings):
    """The Response object (docs/reference/responses.md#response-object), an Open Responses
    2026-04-24 ``ResponseResource``.

    Output items and the settings fields are described in docs/api.md. Keys are sent
    in the order the builder writes them: ``id`` ... ``error``, the settings, then
    ``usage``, ``store``, ``metadata`` and, for an externally served model, ``routing``.
    """

    id: str
    object: Literal["response"]
    created_at: int
    completed_at: Annotated[
        int | None, Field(description="Set when the response ends (any status).")
    ]
    status: ResponseStatus
    incomplete_details: IncompleteDetails | None
    model: str
    previous_response_id: None
    output: list[OutputItem]
    output_text: str
    error: ResponseError | None
    usage: ResponseUsage | None
    store: Literal[False]
    metadata: dict[str, Any]
    routing: NotRequired[dict[str, Any]]


# -- stream events (docs/reference/responses.md#stream-events) ------------------------------
# Each begins with ``type`` (also the SSE ``event:`` name) and ``sequence_number``.


ResponseEventType = Literal[
    "response.created",
    "response.in_progress",
    "response.completed",
    "response.incomplete",
    "response.failed",
]


class ResponseEvent(TypedDict):
    """The Response as it stands: at the start (``created``, ``in_progress``) and at
    its one terminal event."""

    type: ResponseEventType
    sequence_number: int
    response: ResponseResource


class OutputItemEvent(TypedDict):
    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartEvent(TypedDict):
    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


class OutputTextDeltaEvent(TypedDict):
    type: Literal["response.output_text.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[TokenLogprob]


class OutputTextDoneEvent(TypedDict):
    type: Literal["response.output_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[TokenLogprob]


class AnnotationAddedEvent(TypedDict):
    type: Literal["response.output_text.annotation.added"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    annotation_index: int
    annotation: UrlCitation


class ReasoningTextDeltaEvent(TypedDict):
    """The name of docs/reference/responses.md#stream-events (OpenAI's); Open Responses calls it
    ``response.reasoning.delta``."""

    type: Literal["response.reasoning_text.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningTextDoneEvent(TypedDict):
    type: Literal["response.reasoning_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str


class ArgumentsDeltaEvent(TypedDict):
    type: Literal["response.function_call_arguments.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(TypedDict):
    type: Literal["response.function_call_arguments.done"]
    sequence_number: int
    item_id: str
    output_index: int
    arguments: str


ServerToolEventType = Literal[
    "response.web_search_call.in_progress",
    "response.web_search_call.completed",
    "response.web_fetch_call.in_progress",
    "response.web_fetch_call.completed",
    "response.code_interpreter_call.in_progress",
    "response.code_interpreter_call.completed",
]


class ServerToolCallEvent(TypedDict):
    """A server-tool call started running, or completed (an extension)."""

    type: ServerToolEventType
    sequence_number: int
    output_index: int
    item_id: str


StreamEvent = Annotated[
    ResponseEvent
    | OutputItemEvent
    | ContentPartEvent
    | OutputTextDeltaEvent
    | OutputTextDoneEvent
    | AnnotationAddedEvent
    | ReasoningTextDeltaEvent
    | ReasoningTextDoneEvent
    | ArgumentsDeltaEvent
    | ArgumentsDoneEvent
    | ServerToolCallEvent,
    Field(discriminator="type"),
]
"""Every event the route streams; each is serialized by its own type's adapter."""
