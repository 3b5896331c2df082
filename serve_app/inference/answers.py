"""What a service answers: a whole body, or a stream of frames. The routes make it HTTP.

The services speak no web framework: each returns an ``Answer``, and the route hands it
to ``serve_app.routes.answers.http_response``, the one place a Starlette response is
built from one (the same status, headers and bytes either way). The batch worker reads
a ``Body`` directly, as the line's result.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pydantic_core

JSON = "application/json"


@dataclass(frozen=True)
class Body:
    """A whole answer, already serialized."""

    content: bytes
    headers: dict[str, str] = field(default_factory=dict)
    status_code: int = 200
    media_type: str = JSON

    @classmethod
    def json(
        cls, payload: Any, *, status_code: int = 200, headers: dict[str, str] | None = None
    ) -> Body:
        """``payload`` written as JSON the way every JSON body of the API is: compact,
        UTF-8 (non-ASCII characters as they are), NaN refused."""
        return cls(dumps(payload), dict(headers or {}), status_code)

    @classmethod
    def json_with_vectors(cls, payload: Any) -> Body:
        """``payload`` holding float32 numpy arrays (embeddings), written by ``dumps_vectors``."""
        return cls(dumps_vectors(payload))


def dumps(payload: Any) -> bytes:
    """Compact UTF-8 JSON of plain values; NaN and infinities refused (``ValueError``).

    pydantic-core writes it (~10x faster than the standard library on the float arrays of
    an embeddings answer: 0.23 against 2.3 ms for 16 x 384 floats, the gateway replica's
    largest cost per embeddings call). Its output is the standard library's for such values;
    it writes NaN and infinities as bare ``NaN``/``Infinity`` tokens instead of refusing
    them, so an output containing those letters (or a value it cannot write) is written
    again by the standard library, which refuses the bad number or writes the strings.
    """
    try:
        content = pydantic_core.to_json(payload)
    except (pydantic_core.PydanticSerializationError, ValueError, TypeError):
        content = None
    if content is None or b"NaN" in content or b"Infinity" in content:
        content = json.dumps(
            payload, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8")
    return content


def dumps_vectors(payload: Any) -> bytes:
    """Compact UTF-8 JSON of plain values and float32 numpy arrays; every array must be finite.

    orjson writes each float32 as the shortest decimal that reads back as that same float32
    (``0.0063856714``, as OpenAI's API writes its vectors). Widening to Python floats first,
    as ``dumps`` must, writes 17 digits of the float64 widening (``0.006385671440511942``):
    the same float32 once read, in 70% more bytes. For 16 x 384 values: 76 against 129 kB,
    0.15 against 0.53 ms to write, and 0.6 against 1.7 ms for a Python client to parse
    (bench/RESULTS.md, "2026-11-27 11:05-12:30"). orjson writes NaN and infinities as
    ``null``, so the caller refuses arrays that are not finite before it gets here (the
    embeddings service answers them 502, unbilled).
    """
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


@dataclass(frozen=True)
class FrameStream:
    """A streamed answer: its frames, and how to let go of it if they are never all read.

    ``frames`` end the request themselves when consumed to their end or closed
    (``MeteredStream.relay``); ``release`` covers a body that never started (the
    client left first). Both are idempotent.
    """

    frames: AsyncIterator[bytes]
    release: Callable[[], Awaitable[None]]
    headers: dict[str, str] = field(default_factory=dict)
    media_type: str = "text/event-stream"


Answer = Body | FrameStream
"""A service's answer to one request."""
