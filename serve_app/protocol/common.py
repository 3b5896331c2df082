"""Pieces shared by the chat and legacy completion wire formats (spec 2.7, 2.8)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StreamOptions(BaseModel):
    """``stream_options``: only ``include_usage`` acts; other keys are tolerated."""

    model_config = ConfigDict(extra="allow")

    include_usage: bool = Field(default=False, description="Send a final usage chunk.")


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int


class Usage(BaseModel):
    """Token usage; the detail objects appear only when the engine reported them."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None

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
    """Sampling fields common to chat and legacy completions (spec 4.1, 4.2).

    ``extra="allow"``: unknown fields are relayed to the engine (spec 9), and
    the ones the engine cannot honour are named in ``x-service-ignored-params``.
    """

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, description="Catalog id of the model.")
    stream: bool = Field(default=False, description="Answer as server-sent events.")
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, description="Cap on generated tokens.")
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=16, description="Answers per prompt.")
    stop: str | list[str] | None = Field(default=None, description="Up to 4 stop sequences.")
    seed: int | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
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
