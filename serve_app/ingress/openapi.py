"""Shared OpenAPI fragments so /docs shows the error envelope on every route."""

from __future__ import annotations

from typing import Any

from serve_app.protocol.errors import ErrorEnvelope

_STATUSES = {
    400: "Invalid request",
    401: "Missing, malformed, unknown or revoked key",
    403: "Not allowed for this key, user or organization",
    404: "Unknown model or resource",
    413: "Body larger than the limit",
    429: "Rate limit or quota",
    502: "Upstream error",
    503: "Model unavailable or warming (Retry-After)",
    504: "Upstream timeout",
}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorEnvelope, "description": text} for status, text in _STATUSES.items()
}
