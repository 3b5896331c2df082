"""The error vocabulary, as the gateway's protocol package names it.

It lives in ``serve_app.contract.errors`` because heads raise the same errors;
this module keeps the gateway's imports in one obvious place.
"""

from serve_app.contract.errors import (
    ErrorBody,
    ErrorEnvelope,
    GatewayError,
    InvalidRequestError,
    AuthenticationError,
    PermissionDeniedError,
    NotFoundError,
    MethodNotAllowedError,
    ConflictError,
    RequestTooLargeError,
    RateLimitError,
    UpstreamError,
    ModelUnavailableError,
    UpstreamTimeoutError,
    model_warming,
    model_not_found,
    video_jobs_quota_exceeded,
    video_job_not_found,
)

__all__ = [
    "ErrorBody",
    "ErrorEnvelope",
    "GatewayError",
    "InvalidRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "MethodNotAllowedError",
    "ConflictError",
    "RequestTooLargeError",
    "RateLimitError",
    "UpstreamError",
    "ModelUnavailableError",
    "UpstreamTimeoutError",
    "model_warming",
    "model_not_found",
    "video_jobs_quota_exceeded",
    "video_job_not_found",
]
