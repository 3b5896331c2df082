"""The one error vocabulary of the gateway (docs/reference/common.md).

Every layer raises a ``GatewayError`` (or a subclass) and exactly one mapper in
``serve_app.ingress.errors`` turns it into the JSON envelope. Keeping status,
type and code together on the exception means a route never has to remember
which status belongs to which code.

These classes are plain picklable values: they also cross Ray DeploymentHandles
(a head answers with a ``HeadFailure``, the same error as plain values), so they
hold only strings and ints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field


class ErrorBody(BaseModel):
    """The inner object of the envelope."""

    message: str = Field(description="Human-readable explanation.")
    type: str = Field(description="Error family, e.g. invalid_request_error.")
    code: str | None = Field(default=None, description="Stable machine code.")
    param: str | None = Field(default=None, description="The offending parameter.")


class ErrorEnvelope(BaseModel):
    """``{"error": {...}}``: the body of every non-2xx response."""

    error: ErrorBody


class GatewayError(Exception):
    """An error with a known HTTP status and envelope.

    ``headers`` carries extras such as ``Retry-After``; they are part of the
    error because the client needs them to act on it.
    """

    status_code: int = 500
    error_type: str = "api_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.param = param
        self.headers = dict(headers or {})
        if status_code is not None:
            self.status_code = status_code

    def body(self) -> ErrorBody:
        return ErrorBody(
            message=self.message, type=self.error_type, code=self.code, param=self.param
        )

    def envelope(self) -> dict[str, Any]:
        return ErrorEnvelope(error=self.body()).model_dump()

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep subclasses and keyword fields intact when Ray pickles the error.
        return (
            _rebuild,
            (
                type(self),
                self.message,
                self.code,
                self.param,
                self.headers,
                self.status_code,
            ),
        )


def _rebuild(
    cls: type[GatewayError],
    message: str,
    code: str | None,
    param: str | None,
    headers: dict[str, str],
    status_code: int,
) -> GatewayError:
    return cls(message, code=code, param=param, headers=headers, status_code=status_code)


class InvalidRequestError(GatewayError):
    """400: the request breaks a rule of the API (docs/reference/common.md#error-codes)."""

    status_code = 400
    error_type = "invalid_request_error"


class AuthenticationError(GatewayError):
    """401: no usable key."""

    status_code = 401
    error_type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(GatewayError):
    """403: the caller is known but may not do this."""

    status_code = 403
    error_type = "permission_error"
    default_code = "insufficient_permissions"


class NotFoundError(GatewayError):
    """404: unknown model, job or route."""

    status_code = 404
    error_type = "invalid_request_error"


class MethodNotAllowedError(GatewayError):
    """405: route exists, method does not."""

    status_code = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class ConflictError(GatewayError):
    """409: the resource is in a state that forbids the change."""

    status_code = 409
    error_type = "invalid_request_error"


class RequestTooLargeError(GatewayError):
    """413: body beyond the configured limit."""

    status_code = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class RateLimitError(GatewayError):
    """429: rate limit or quota; carries ``Retry-After`` where a wait helps."""

    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class UpstreamError(GatewayError):
    """502: the model head failed in a way a retry will not fix."""

    status_code = 502
    error_type = "api_error"
    default_code = "upstream_error"


class ModelUnavailableError(GatewayError):
    """503: no replica can take the call now; retryable."""

    status_code = 503
    error_type = "api_error"
    default_code = "model_unavailable"


class UpstreamTimeoutError(GatewayError):
    """504: the head did not answer in time."""

    status_code = 504
    error_type = "api_error"
    default_code = "upstream_timeout"


@dataclass
class HeadFailure:
    """An error as plain values, rebuilt into a ``GatewayError`` by the gateway.

    A head answers with one instead of raising, so a caller mistake found inside
    the head keeps its status and code rather than arriving as Ray's generic task
    error.
    """

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


def model_warming(model: str, retry_after_s: int) -> ModelUnavailableError:
    """503 ``model_warming``: the head is still starting; tell the client when to retry."""
    return ModelUnavailableError(
        f"Model '{model}' is still starting; retry in {retry_after_s} s.",
        code="model_warming",
        headers={"Retry-After": str(max(1, int(retry_after_s)))},
    )


def model_not_found(model: str) -> NotFoundError:
    return NotFoundError(
        f"The model '{model}' does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )


def video_jobs_quota_exceeded(cap: int, retry_after_s: int) -> RateLimitError:
    """429 ``video_jobs_quota_exceeded``: the caller already has ``cap`` unfinished jobs."""
    return RateLimitError(
        f"You already have {cap} unfinished video generation jobs; wait for one to finish "
        "or cancel one.",
        code="video_jobs_quota_exceeded",
        headers={"Retry-After": str(max(1, int(retry_after_s)))},
    )


def video_job_not_found(job_id: str) -> NotFoundError:
    """404 for a job that does not exist and for another user's job alike
    (docs/reference/video.md#read-a-job)."""
    shown = job_id if len(job_id) <= 64 else f"{job_id[:64]}..."
    return NotFoundError(
        f"No video generation job found with id '{shown}'.",
        code="video_job_not_found",
        param="job_id",
    )
