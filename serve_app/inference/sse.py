"""Server-sent events framing: ``data:`` lines, named events, the error event, ``[DONE]``.

The chat and completions chunks are serialized by their protocol types
(``serve_app.inference.chat.assemble``) and framed with ``sse_frame``; so are the
responses route's named events (``serve_app.inference.responses.render``, which
writes their ``event:`` line). The error envelope is a plain dict (``sse_error``).
A failure after the first byte is never a silent cut: it is
``data: {"error": {...}}`` (then ``data: [DONE]`` on the chat routes).
"""

from __future__ import annotations

import json
from typing import Any

from serve_app.protocol.errors import GatewayError

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE_LINE = b"data: [DONE]\n\n"


def sse_frame(payload: bytes) -> bytes:
    """One ``data:`` event around an already serialized JSON payload."""
    return b"data: " + payload + b"\n\n"


def sse_data(payload: dict[str, Any]) -> bytes:
    return sse_frame(json.dumps(payload, separators=(",", ":")).encode())


def sse_error(err: GatewayError) -> bytes:
    return sse_data(err.envelope())
