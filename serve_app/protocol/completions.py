"""Wire format of the legacy ``POST /v1/completions`` (docs/reference/chat.md#completions)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, Field, WithJsonSchema, field_validator
from typing_extensions import TypedDict

from serve_app.protocol.common import SamplingFields, Usage, absent_if_none

_PROMPT = {"type": "string", "minLength": 1}
_PROMPTS = {"type": "array", "items": _PROMPT, "minItems": 1}


class CompletionRequest(SamplingFields):
    """Request body; each prompt of an array is generated separately."""

    prompt: (
        Annotated[str, WithJsonSchema(_PROMPT)] | Annotated[list[str], WithJsonSchema(_PROMPTS)]
    ) = Field(description="One non-empty prompt or a non-empty list of them.")

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value: str | list[str]) -> str | list[str]:
        # An empty prompt reached the engine, which failed it as if it could not start (502).
        if isinstance(value, list) and not value:
            raise ValueError("prompt must contain at least one item")
        prompts = [value] if isinstance(value, str) else value
        if any(not p for p in prompts):
            raise ValueError("prompt must not be an empty string")
        return value

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    routing: dict[str, Any] | None = Field(default=None, exclude_if=absent_if_none)


class CompletionChunkChoice(TypedDict):
    """A streamed choice; ``finish_reason`` and ``logprobs`` are ``null`` until set."""

    index: int
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None


class CompletionChunk(TypedDict):
    """One SSE event of the legacy route (a TypedDict for the reason given in
    ``serve_app.protocol.chat``); ``usage`` and ``routing`` come with ``choices: []``."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: NotRequired[Usage]
    routing: NotRequired[dict[str, Any]]
