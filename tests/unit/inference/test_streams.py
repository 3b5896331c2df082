"""``MeteredStream``: the one end of every metered stream (close, finish, error frames).

The routes' own tests drive it through the app (mid-stream failures, clients
leaving); these pin its contract directly: the head stream is closed and the
request finished before any failure or closing frame is sent, ``aborted`` is
true only when the consumer left, and an unexpected exception is worded as
``upstream_error``, never leaked.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from serve_app.auth.principal import Principal
from serve_app.catalog.config import CatalogModel
from serve_app.contract.chat import GenerationDone, HeadEvent, HeadStarted, TextDelta
from serve_app.contract.errors import HeadFailure
from serve_app.inference.metering import MeteredRequest, Metering, RequestMeta
from serve_app.inference.streams import MeteredStream
from serve_app.protocol.errors import GatewayError


class _Source:
    """Head events, then optionally an exception; records whether it was closed."""

    def __init__(self, events: list[HeadEvent], error: Exception | None = None) -> None:
        self.events = events
        self.error = error
        self.closed = False

    async def gen(self) -> AsyncIterator[HeadEvent]:
        try:
            for event in self.events:
                yield event
            if self.error is not None:
                raise self.error
        finally:
            self.closed = True


async def _metered() -> MeteredRequest:
    principal = Principal("k", "u", "o", "member", frozenset({"inference"}))
    meta = RequestMeta(
        principal,
        CatalogModel(id="m", head="chat", context_length=64, max_output_tokens=8),
        "chat",
        "req-1",
        1,
    )
    return await Metering().admit(meta, HeadStarted(prompt_tokens=3, max_tokens=8))


def _frame(event: HeadEvent) -> list[bytes]:
    if isinstance(event, TextDelta):
        return [event.text.encode()]
    return []


async def _relay(source: _Source, metered: MeteredRequest, seen: list[tuple[bool, bool]]) -> bytes:
    stream = MeteredStream(source.gen(), metered, observe=metered.observe)

    def on_failure(err: GatewayError) -> list[bytes]:
        seen.append((source.closed, metered.finished))
        return [f"<{err.code}>".encode()]

    frames = stream.relay(_frame, opening=[b"["], on_failure=on_failure, closing=[b"]"])
    return b"".join([frame async for frame in frames])


DELTAS: list[HeadEvent] = [TextDelta(0, text="a", completion_tokens=1)]


@pytest.mark.parametrize(
    "error, expected",
    [
        (None, b"[ab]"),
        (GatewayError("no", code="engine_error"), b"[a<engine_error>]"),
        (RuntimeError("secret detail"), b"[a<upstream_error>]"),
    ],
    ids=["done", "gateway error", "unexpected error"],
)
async def test_relay_finishes_before_failure_and_closing_frames(
    error: Exception | None, expected: bytes
) -> None:
    metered = await _metered()
    tail: list[HeadEvent] = (
        [TextDelta(0, text="b", completion_tokens=2), GenerationDone(3, 2)] if error is None else []
    )
    source = _Source(DELTAS + tail, error)
    seen: list[tuple[bool, bool]] = []
    assert await _relay(source, metered, seen) == expected
    assert source.closed and metered.finished
    assert seen == ([] if error is None else [(True, True)])
    assert metered.status(aborted=False) == ("ok" if error is None else "partial")
    assert metered.usage.quantities(1).completion_tokens == (2 if error is None else 1)


async def test_a_head_failure_event_ends_the_stream_as_its_error() -> None:
    metered = await _metered()
    failure = HeadFailure(400, "invalid_request_error", "too long", "context_length_exceeded")
    source = _Source([*DELTAS, failure, TextDelta(0, text="never")])
    assert await _relay(source, metered, []) == b"[a<context_length_exceeded>]"
    assert source.closed and metered.finished


async def test_a_consumer_that_leaves_is_billed_as_aborted() -> None:
    metered = await _metered()
    source = _Source([*DELTAS, TextDelta(0, text="b", completion_tokens=2)])
    stream = MeteredStream(source.gen(), metered, observe=metered.observe)
    frames = stream.relay(_frame)
    assert await anext(frames) == b"a"
    await frames.aclose()  # the client went away mid-stream
    assert source.closed and metered.finished
    assert metered.status(aborted=True) == "aborted"
    await stream.release()  # the response's release afterwards changes nothing
    assert metered.usage.quantities(1).completion_tokens == 1


async def test_release_of_a_stream_never_started_closes_and_finishes() -> None:
    metered = await _metered()
    source = _Source(DELTAS)
    stream = MeteredStream(source.gen(), metered, observe=metered.observe)
    await anext(stream.events)  # the head started; the body never did
    await stream.release()
    assert source.closed and metered.finished


async def test_drain_raises_or_keeps_the_failure() -> None:
    metered = await _metered()
    seen: list[HeadEvent] = []
    stream = MeteredStream(_Source(DELTAS, RuntimeError("x")).gen(), metered)
    with pytest.raises(RuntimeError):
        await stream.drain(seen.append)
    assert metered.finished and seen == DELTAS
    assert metered.usage.quantities(1).completion_tokens == 0  # observe not asked for

    metered = await _metered()
    stream = MeteredStream(_Source(DELTAS, RuntimeError("x")).gen(), metered)
    failure = await stream.drain(seen.append, keep_failure=True)
    assert failure is not None and failure.code == "upstream_error"
    assert "x" not in json.dumps(failure.envelope())
    assert metered.finished
