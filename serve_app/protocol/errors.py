"""The error vocabulary, as the gateway's protocol package names it.

It lives in ``serve_app.contract.errors`` because heads raise the same errors;
this module keeps the gateway's imports in one obvious place.
"""

from serve_app.contract.errors import (
    AuthenticationError,
    ConflictError,
    ErrorBody,
    ErrorEnvelope,
    GatewayError,
    InvalidRequestError,
    MethodNotAllowedError,
    ModelUnavailableError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RequestTooLargeError,
    UpstreamError,
    UpstreamTimeoutError,
    model_not_found,
    model_warming,
    video_job_not_found,
    video_jobs_quota_exceeded,
)

__all__ = [
    "AuthenticationError",
    "ConflictError",
    "ErrorBody",
    "ErrorEnvelope",
    "GatewayError",
    "InvalidRequestError",
    "MethodNotAllowedError",
    "ModelUnavailableError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTooLargeError",
    "UpstreamError",
    "UpstreamTimeoutError",
    "model_not_found",
    "model_warming",
    "video_job_not_found",
    "video_jobs_quota_exceeded",
]
