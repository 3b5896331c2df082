"""Server-sent events: framing, the first-item peek and per-item timeouts.

The one place that knows how a stream starts and ends. A stream whose first
head event is a failure never becomes a 200: ``open_head_stream`` peeks at it
before any ``StreamingResponse`` exists, so the client gets a real status. A
failure after the first byte becomes ``data: {"error": {...}}`` followed by
``data: [DONE]`` — never a silent cut.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from serve_app.contract.errors import HeadFailure
from serve_app.contract.text import HeadEvent, HeadStarted
from serve_app.protocol.errors import GatewayError, UpstreamTimeoutError

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE_LINE = b"data: [DONE]\n\n"


def sse_data(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def sse_event(event: str, payload: dict[str, Any]) -> bytes:
    """A named event (responses route): ``event:`` line then ``data:`` line."""
    return f"event: {event}\n".encode() + sse_data(payload)


def sse_error(err: GatewayError) -> bytes:
    return sse_data(err.envelope())


async def with_timeouts(
    events: AsyncIterator[HeadEvent], first_s: float, idle_s: float, model: str
) -> AsyncIterator[HeadEvent]:
    """Re-yield ``events``; a gap longer than the allowance becomes a 504."""
    limit = first_s
    iterator = aiter(events)
    try:
        while True:
            try:
                async with asyncio.timeout(limit):
                    event = await anext(iterator)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise UpstreamTimeoutError(
                    f"Model '{model}' did not answer within {limit:g} s."
                ) from None
            limit = idle_s
            yield event
    finally:
        await aclose_quietly(iterator)


async def open_head_stream(
    events: AsyncIterator[HeadEvent],
) -> tuple[HeadStarted, AsyncIterator[HeadEvent]]:
    """Read up to the first output; raise an early error, else return the whole stream.

    Both the head's acceptance (``HeadStarted``) and the first item after it are
    read before any response exists, so an engine that fails before producing
    anything still gets a real status instead of a 200 with an error event.
    """
    started, iterator = await read_head_started(events)
    return started, await peek_first_output(iterator)


async def read_head_started(
    events: AsyncIterator[HeadEvent],
) -> tuple[HeadStarted, AsyncIterator[HeadEvent]]:
    """The first half of ``open_head_stream``: the head's acceptance only.

    Admission (limits) goes between the two halves: deciding a 429 must not wait
    for the first token, or a refused request would already have been generated
    (and, on an external model, paid to the provider).
    """
    iterator = aiter(events)
    try:
        first = await _next_or_fail(iterator)
    except BaseException:
        await aclose_quietly(iterator)
        raise
    if not isinstance(first, HeadStarted):
        await aclose_quietly(iterator)
        if isinstance(first, HeadFailure):
            raise first.to_error()
        raise GatewayError(f"Unexpected first head event {type(first).__name__}.")
    return first, iterator


async def peek_first_output(
    iterator: AsyncIterator[HeadEvent],
    on_output: Callable[[HeadEvent], None] | None = None,
) -> AsyncIterator[HeadEvent]:
    """The second half of ``open_head_stream``: the first item after ``HeadStarted``.

    A failure there raises (a real status); otherwise the item is put back in
    front. ``on_output`` sees it at once: it was generated even if the client
    leaves before it is relayed, and metering must count it.
    """
    try:
        second = await _next_or_fail(iterator)
    except BaseException:
        await aclose_quietly(iterator)
        raise
    if isinstance(second, HeadFailure):
        await aclose_quietly(iterator)
        raise second.to_error()
    if on_output is not None:
        on_output(second)
    return _prepend(second, iterator)


async def _next_or_fail(iterator: AsyncIterator[HeadEvent]) -> HeadEvent:
    try:
        return await anext(iterator)
    except StopAsyncIteration:
        raise GatewayError("The model head closed the stream without answering.") from None


async def _prepend(item: HeadEvent, rest: AsyncIterator[HeadEvent]) -> AsyncIterator[HeadEvent]:
    try:
        yield item
        async for event in rest:
            yield event
    finally:
        await aclose_quietly(rest)


async def aclose_quietly(iterator: AsyncIterator[Any]) -> None:
    """Close an async generator so the work behind it (a head request) stops."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()
