"""Values exchanged between the gateway ingress and a text head over a handle.

Only plain dataclasses cross a DeploymentHandle (never a Starlette request), so
the head can run in another process, on another node, or in-process in tests.
A head stream is: one ``HeadStarted`` (or one ``HeadFailure``), then
``TextDelta`` items, then ``GenerationDone``; a ``HeadFailure`` may replace
any later item when the engine breaks mid-stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deployments.engines.base import GenerationDone, PromptSpec, SamplingSpec, TextDelta
from serve_app.contract.errors import GatewayError


@dataclass
class HeadRequest:
    """A validated generation request for one model.

    ``max_tokens`` is ``None`` when the caller omitted it: the head then uses
    the remaining window, capped by ``max_output_tokens``. ``prompts`` has one
    entry for chat, one per prompt for legacy completions.
    """

    request_id: str
    prompts: list[PromptSpec]
    sampling: SamplingSpec
    max_tokens: int | None
    max_tokens_param: str
    max_output_tokens: int
    prompt_param: str = "messages"
    stream: bool = True
    """False: the head may answer with one whole result per choice instead of a token
    stream (a non-streamed call without server tools: nothing to relay early)."""


@dataclass
class HeadStarted:
    """The prompt was accepted; generation begins."""

    prompt_tokens: int
    max_tokens: int
    ignored_params: list[str] = field(default_factory=list)


@dataclass
class HeadFailure:
    """An error as plain values, rebuilt into a ``GatewayError`` by the gateway."""

    status_code: int
    error_type: str
    message: str
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_error(cls, err: GatewayError) -> HeadFailure:
        return cls(
            status_code=err.status_code,
            error_type=err.error_type,
            message=err.message,
            code=err.code,
            param=err.param,
            headers=dict(err.headers),
        )

    def to_error(self) -> GatewayError:
        error = GatewayError(
            self.message,
            code=self.code,
            param=self.param,
            headers=self.headers,
            status_code=self.status_code,
        )
        error.error_type = self.error_type
        return error


HeadEvent = HeadStarted | HeadFailure | TextDelta | GenerationDone
