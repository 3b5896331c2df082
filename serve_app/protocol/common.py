"""Pieces shared by the chat and legacy completion wire formats (docs/reference/chat.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    WithJsonSchema,
    field_validator,
)


def _json_number(value: Any) -> Any:
    """Refuse what pydantic's lax mode would coerce into a number: ``"5"`` and ``true``.

    A JSON number written as ``2.0`` still counts as the integer 2 (lax mode
    keeps refusing ``2.5``); only strings and booleans are refused, as the
    official API does, so a request never runs with a value the caller did not
    write as a number.
    """
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(value, str):
        raise ValueError("expected a number, got a string")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_number)]
"""An integer sent as a JSON number (not a string, not a boolean)."""
JsonFloat = Annotated[float, BeforeValidator(_json_number)]
"""A number sent as a JSON number (not a string, not a boolean)."""
JsonBool = Annotated[bool, Strict()]


def _integral_float(value: Any) -> Any:
    """``2.0`` -> ``2``: JSON Schema (and so the published OpenAPI) counts an integral
    number as an integer whatever its spelling, so a strict integer field must too.
    ``2.5``, strings and booleans stay as they are, for the strict check to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WholeInt = Annotated[int, BeforeValidator(_integral_float), Strict()]
"""A strict integer that accepts an integral JSON number (``1333.0``) and nothing else."""
"""``true`` or ``false`` only: ``"yes"`` or ``1`` would otherwise switch streaming on."""

_STOPS = {"type": "array", "items": {"type": "string"}, "maxItems": 4}
"""Published form of ``_at_most_four_stops`` (the validator keeps its own message)."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class StreamOptions(BaseModel):
    """``stream_options``: only ``include_usage`` acts; other keys are tolerated."""

    model_config = ConfigDict(extra="allow")

    include_usage: JsonBool = Field(default=False, description="Send a final usage chunk.")


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int


def absent_if_none(value: Any) -> bool:
    """``exclude_if`` of an optional wire field that is left out, not sent as ``null``.

    The answer bodies say per field which it is: ``logprobs: null`` and a tool
    call's ``content: null`` are part of the wire format, an unset
    ``reasoning_content`` or ``routing`` is not there at all.
    """
    return value is None


class Usage(BaseModel):
    """Token usage; the detail objects appear only when the engine reported them."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = Field(
        default=None, exclude_if=absent_if_none
    )
    completion_tokens_details: CompletionTokensDetails | None = Field(
        default=None, exclude_if=absent_if_none
    )

    @classmethod
    def build(
        cls,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int | None = None,
        reasoning_tokens: int | None = None,
    ) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=(
                PromptTokensDetails(cached_tokens=cached_tokens)
                if cached_tokens is not None
                else None
            ),
            completion_tokens_details=(
                CompletionTokensDetails(reasoning_tokens=reasoning_tokens)
                if reasoning_tokens is not None
                else None
            ),
        )


class SamplingFields(BaseModel):
    """Sampling fields common to chat and legacy completions (docs/reference/chat.md).

    ``extra="allow"``: unknown fields are relayed to the engine
    (docs/reference/common.md#versioning), and the ones the engine cannot honour are named in
    ``x-service-ignored-params``.
    """

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, description="Catalog id of the model.")
    stream: JsonBool = Field(default=False, description="Answer as server-sent events.")
    stream_options: StreamOptions | None = None
    max_tokens: JsonInt | None = Field(default=None, ge=1, description="Cap on generated tokens.")
    temperature: JsonFloat | None = Field(default=None, ge=0, le=2)
    top_p: JsonFloat | None = Field(default=None, gt=0, le=1)
    n: JsonInt = Field(default=1, ge=1, le=16, description="Answers per prompt.")
    stop: str | Annotated[list[str], WithJsonSchema(_STOPS)] | None = Field(
        default=None, description="Up to 4 stop sequences."
    )
    seed: JsonInt | None = Field(
        default=None, ge=INT64_MIN, le=INT64_MAX, description="A signed 64-bit integer."
    )
    frequency_penalty: JsonFloat | None = Field(default=None, ge=-2, le=2)
    presence_penalty: JsonFloat | None = Field(default=None, ge=-2, le=2)
    user: str | None = Field(default=None, description="End-user id; accepted, not used.")

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        return value

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def relayed_extras(self) -> dict[str, object]:
        """Fields outside the declared schema, as the client sent them."""
        return dict(self.model_extra or {})

    def unencodable_field(self) -> str | None:
        """The first string (value or key) that is not valid Unicode, as a ``param`` path
        (``""`` for a broken top-level field name), or ``None`` when all text is valid.

        JSON may escape half of a UTF-16 surrogate pair (``"\\ud800"``); Python
        decodes it to a lone surrogate that no engine can encode and no response
        can echo, so the route refuses it with a 400 naming the field.
        """
        return next(_unencodable_paths(self.model_dump(exclude_unset=True), ""), None)


def first_unencodable(value: Any) -> str | None:
    """``SamplingFields.unencodable_field`` for any dumped body (the Messages API's)."""
    return next(_unencodable_paths(value, ""), None)


def _unencodable_paths(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, str):
        if not value.isascii() and not _encodable(value):
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and not key.isascii() and not _encodable(key):
                yield path  # "" when a top-level field name itself is broken
            yield from _unencodable_paths(item, child)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _unencodable_paths(item, f"{path}[{index}]")


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
