"""Head streams: how one starts (first-event peek, timeouts) and how it ends (metered).

A stream whose first head event is a failure never becomes a 200: the text
service reads the head's acceptance (``read_head_started``), admits the
request, then peeks at the first output (``peek_first_output``) before any
answer exists, so the client gets a real status.

After that, ``MeteredStream`` is the one place a stream ends, for chat,
completions, responses and the server-tool loop alike: whatever way it ends
(done, the model failed, the client left, the body never started) the head
stream is closed, which aborts the engine request, ``MeteredRequest.finish``
runs once (``aborted`` only when the client left), and a failure becomes the
route's error frames (an SSE error event by default) or is raised to the
caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Generic, TypeVar

from serve_app.contract.chat import HeadEvent, HeadStarted
from serve_app.contract.errors import HeadFailure
from serve_app.inference.answers import FrameStream
from serve_app.inference.metering import MeteredRequest
from serve_app.inference.sse import SSE_HEADERS, sse_error
from serve_app.protocol.errors import GatewayError, UpstreamError, UpstreamTimeoutError

logger = logging.getLogger(__name__)

E = TypeVar("E")


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


async def read_head_started(
    events: AsyncIterator[HeadEvent],
) -> tuple[HeadStarted, AsyncIterator[HeadEvent]]:
    """The head's acceptance (``HeadStarted``) only; an earlier failure raises.

    Admission (limits) goes between this and ``peek_first_output``: deciding a
    429 must not wait for the first token, or a refused request would already
    have been generated (and, on an external model, paid to the provider).
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
    """The first item after ``HeadStarted``, read before any response exists.

    A failure there raises (a real status: an engine that fails before
    producing anything never answers 200 with an error event); otherwise the
    item is put back in front. ``on_output`` sees it at once: it was generated
    even if the client leaves before it is relayed, and metering must count it.
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


def _error_frames(err: GatewayError) -> Iterable[bytes]:
    return (sse_error(err),)


class MeteredStream(Generic[E]):
    """The events of one admitted request and the one place their end is handled.

    ``events`` are head events (``observe=metered.observe``: each is metered
    here) or the tool loop's events (the loop meters its turns itself). A ``HeadFailure``
    among head events is the model failing mid-stream, raised as its error.
    Consume the stream once, with ``relay`` (SSE frames) or ``drain`` (a whole
    body); ``release`` covers a stream nobody consumed to the end.
    """

    def __init__(
        self,
        events: AsyncIterator[E],
        metered: MeteredRequest,
        *,
        observe: Callable[[E], None] | None = None,
        label: str = "stream",
    ) -> None:
        self.events = events
        self.metered = metered
        self.observe = observe
        self.label = label
        """Names the stream in the log line of an unexpected failure."""

    async def release(self) -> None:
        """The client left, or the body never started: stop the head, bill as aborted.

        Idempotent, like ``MeteredRequest.finish``: after a stream that ended by
        itself it changes nothing.
        """
        await aclose_quietly(self.events)
        await self.metered.finish(aborted=True)

    async def relay(
        self,
        render: Callable[[E], Iterable[bytes]],
        *,
        opening: Iterable[bytes] = (),
        on_failure: Callable[[GatewayError], Iterable[bytes]] = _error_frames,
        closing: Iterable[bytes] = (),
    ) -> AsyncIterator[bytes]:
        """The body of a streamed answer: ``opening``, each event's frames, the end.

        Once the stream is over (and only then) the head is closed and the request
        finished; a failure after the first byte becomes ``on_failure``'s frames,
        then ``closing`` ends every stream, failed or not.
        """
        failure: GatewayError | None = None
        aborted = True  # stays True only when the client leaves mid-stream
        observe = self.observe
        try:
            for frame in opening:
                yield frame
            async for event in self.events:
                if observe is not None:
                    observe(event)
                if isinstance(event, HeadFailure):
                    raise event.to_error()
                for frame in render(event):
                    yield frame
            aborted = False
        except Exception as exc:
            aborted = False
            failure = self._failure(exc)
        finally:
            await self._end(aborted)
        if failure is not None:
            for frame in on_failure(failure):
                yield frame
        for frame in closing:
            yield frame

    async def drain(
        self, handle: Callable[[E], object], *, keep_failure: bool = False
    ) -> GatewayError | None:
        """Feed every event to ``handle`` (a non-streamed answer), then end the stream.

        A failure is raised as it came, or with ``keep_failure`` returned as a
        ``GatewayError`` (an unexpected one logged) for the caller to render.
        """
        aborted = True  # stays True only when cancelled (the client went away)
        observe = self.observe
        try:
            async for event in self.events:
                if observe is not None:
                    observe(event)
                if isinstance(event, HeadFailure):
                    raise event.to_error()
                handle(event)
            aborted = False
        except Exception as exc:
            aborted = False
            if not keep_failure:
                raise
            return self._failure(exc)
        finally:
            await self._end(aborted)
        return None

    def _failure(self, exc: Exception) -> GatewayError:
        if isinstance(exc, GatewayError):
            return exc
        logger.exception("%s failed", self.label, exc_info=exc)
        return UpstreamError("The model stream broke.")

    async def _end(self, aborted: bool) -> None:
        # Client gone or stream over: release the head (aborts the engine request),
        # then bill what was produced and settle the reservation.
        await aclose_quietly(self.events)
        await self.metered.finish(aborted=aborted)


def sse_stream(
    stream: MeteredStream[Any], frames: AsyncIterator[bytes], headers: dict[str, str]
) -> FrameStream:
    """``frames`` (from ``stream.relay``) as a ``text/event-stream`` answer."""
    return FrameStream(frames, stream.release, {**SSE_HEADERS, **headers})
