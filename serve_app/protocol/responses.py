"""Wire format of ``POST /v1/responses`` (spec 2.10, 4.3, 6).

Unlike chat, the request is closed: an unlisted field is a 400
``unknown_parameter`` (``extra="forbid"``; the error mapper turns pydantic's
``extra_forbidden`` into that code). Input items and tools stay loosely typed
here and are checked by ``serve_app.inference.responses_input`` so every
refusal can name its exact ``param`` (``input[2].content[0].type``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from serve_app.protocol.tool_schemas import RESPONSES_FUNCTION_TOOL, tools_schema

ResponseStatus = Literal["completed", "incomplete", "failed", "in_progress"]


class ReasoningParam(BaseModel):
    """``reasoning``: ``effort`` switches deliberation; ``summary`` is refused."""

    model_config = ConfigDict(extra="forbid")

    effort: str | None = Field(default=None, description="none, minimal, low, medium, high.")
    summary: Any = Field(default=None, description="Not supported: 400 when set.")


_INPUT_ITEMS = {"type": "array", "items": {"type": "object"}, "minItems": 1}


class ResponsesRequest(BaseModel):
    """Request body; every field of spec 4.3 and nothing else."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="Catalog id of a chat model.")
    input: str | Annotated[list[dict[str, Any]], WithJsonSchema(_INPUT_ITEMS)] = Field(
        description="A user turn as a string, or input items (message, function_call, "
        "function_call_output)."
    )
    instructions: str | None = Field(default=None, description="Prepended as a system turn.")
    max_output_tokens: int | None = Field(default=None, ge=1, description="Cap on output.")
    metadata: dict[str, Any] | None = Field(default=None, description="Echoed, not stored.")
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = Field(default=None, description="Must be null.")
    reasoning: ReasoningParam | None = None
    seed: int | None = None
    store: bool | None = Field(default=None, description="Must be false (stateless route).")
    stream: bool = Field(default=False, description="Answer as named server-sent events.")
    temperature: float | None = Field(default=None, ge=0, le=2)
    text: dict[str, Any] | None = Field(default=None, description="Only {format: {type: text}}.")
    tool_choice: str | dict[str, Any] | None = None
    tools: Annotated[
        list[dict[str, Any]] | None, WithJsonSchema(tools_schema(RESPONSES_FUNCTION_TOOL))
    ] = None
    top_p: float | None = Field(default=None, gt=0, le=1)
    user: str | None = Field(default=None, description="End-user id; accepted, not used.")

    @field_validator("input")
    @classmethod
    def _at_least_one_item(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(value, list) and not value:
            raise ValueError("input needs at least one item")
        return value


class ResponseUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int] = Field(description="{cached_tokens}; always present.")
    output_tokens_details: dict[str, int] | None = Field(
        default=None,
        description="{reasoning_tokens}; only when the engine reported the split (spec 2.7).",
    )


class ResponseObject(BaseModel):
    """The Response object (spec 2.10), an Open Responses 2026-04-24 ``ResponseResource``.

    Output items and the settings fields are described in docs/api.md; the settings
    state what was applied (``responses_echo``), never a null where a value applied.
    """

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = Field(description="Set when the response ends (any status).")
    status: ResponseStatus
    incomplete_details: dict[str, Any] | None = None
    model: str
    previous_response_id: None = None
    instructions: str | None = None
    output: list[dict[str, Any]]
    output_text: str = ""
    error: dict[str, Any] | None = None
    tools: list[dict[str, Any]] = Field(
        description="Function tools flat, then server tools with their applied budgets."
    )
    tool_choice: str | dict[str, Any]
    truncation: Literal["disabled"] = "disabled"
    parallel_tool_calls: bool = True
    text: dict[str, Any] = Field(description="{format: {type: text}}.")
    top_p: float
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0
    temperature: float
    reasoning: dict[str, Any] | None = None
    usage: ResponseUsage | None = None
    max_output_tokens: int | None = Field(description="The output cap the head applied.")
    max_tool_calls: int | None = Field(description="Sum of the server-tool budgets, if any.")
    store: Literal[False] = False
    background: Literal[False] = False
    service_tier: str = "default"
    metadata: dict[str, Any] = Field(default_factory=dict)
    safety_identifier: None = None
    prompt_cache_key: None = None
