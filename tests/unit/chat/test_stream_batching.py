"""Head streams cross the handle in batches: eager until the first token, then windowed.

Which events share a batch is decided by when each window ends. The tests that assert
batches end the windows themselves (``_Windows``, passed as ``coalesce``'s timer) and
pace the producer on what the consumer received, so a slow or busy machine cannot
split or join a batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from deployments.stream_batching import StreamLoad, coalesce, merge_deltas
from serve_app.contract.chat import GenerationDone, HeadStarted, TextDelta, ToolCallDelta
from tests.fixtures.waiting import until


async def _timed(items: list[tuple[float, Any]]) -> AsyncIterator[Any]:
    for delay, item in items:
        await asyncio.sleep(delay)
        if isinstance(item, BaseException):
            raise item
        yield item


async def _collect(stream: AsyncIterator[list[Any]]) -> list[list[Any]]:
    return [batch async for batch in stream]


def _tokens(n: int, delay: float) -> list[tuple[float, Any]]:
    return [(delay, TextDelta(0, text=f"t{i} ", completion_tokens=i + 1)) for i in range(n)]


def _token(i: int) -> TextDelta:
    return TextDelta(0, text=f"t{i} ", completion_tokens=i + 1)


def _merged(first: int, last: int) -> TextDelta:
    """Tokens ``first``..``last`` as one delta (what a batch of them is merged into)."""
    text = "".join(f"t{i} " for i in range(first, last + 1))
    return TextDelta(0, text=text, completion_tokens=last + 1)


class _Windows:
    """``coalesce``'s timer, run by the test: a window ends when ``close`` says its time is
    up (or when the producer ends), never on the machine's clock. ``widths`` are the
    windows asked for, in order."""

    def __init__(self) -> None:
        self.widths: list[float] = []
        self._open: asyncio.Timeout | None = None

    def __call__(self, width: float) -> asyncio.Timeout:
        self.widths.append(width)
        self._open = asyncio.timeout(None)
        return self._open

    async def opened(self, count: int) -> None:
        """Until the ``count``-th window is open (the consumer waits in it)."""
        await until(lambda: len(self.widths) >= count)

    def close(self) -> None:
        assert self._open is not None
        self._open.reschedule(asyncio.get_running_loop().time())


async def test_first_events_go_alone_and_the_rest_in_merged_windows() -> None:
    started = HeadStarted(prompt_tokens=5, max_tokens=20)
    done = GenerationDone(prompt_tokens=5, completion_tokens=20)
    windows = _Windows()
    batches: list[list[Any]] = []

    async def produce() -> AsyncIterator[Any]:
        yield started
        yield _token(0)
        yield _token(1)  # opens the first window
        await windows.opened(1)
        for i in range(2, 10):
            await asyncio.sleep(0)  # each on its own turn of the loop, inside the window
            yield _token(i)
        windows.close()  # its time is up
        await until(lambda: len(batches) == 3)
        yield _token(10)  # opens the second window
        await windows.opened(2)
        for i in range(11, 20):
            await asyncio.sleep(0)
            yield _token(i)
        yield done  # the end closes the second window before its time

    async for batch in coalesce(produce(), interval_s=0.03, timer=windows):
        batches.append(batch)
    assert batches == [[started], [_token(0)], [_merged(1, 9)], [_merged(10, 19), done]]
    assert windows.widths == [0.03, 0.03]


async def test_no_interval_sends_the_rest_of_the_answer_at_once() -> None:
    started = HeadStarted(prompt_tokens=1, max_tokens=8)
    done = GenerationDone(prompt_tokens=1, completion_tokens=8)
    batches = await _collect(coalesce(_timed([(0, started), *_tokens(8, 0.001), (0, done)]), None))
    assert len(batches) == 3
    assert batches[2] == [TextDelta(0, text="t1 t2 t3 t4 t5 t6 t7 ", completion_tokens=8), done]


async def test_a_producer_error_arrives_after_what_was_produced() -> None:
    events = [(0, HeadStarted(1, 4)), *_tokens(3, 0.0), (0.0, RuntimeError("engine broke"))]
    seen: list[Any] = []
    with pytest.raises(RuntimeError, match="engine broke"):
        async for batch in coalesce(_timed(events), interval_s=0.01):
            seen.extend(batch)
    assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == "t0 t1 t2 "


async def test_leaving_early_cancels_the_producer() -> None:
    cancelled = asyncio.Event()

    async def endless() -> AsyncIterator[Any]:
        try:
            yield HeadStarted(1, 10)
            while True:
                await asyncio.sleep(0.001)
                yield TextDelta(0, text="x", completion_tokens=1)
        finally:
            cancelled.set()

    stream = coalesce(endless(), interval_s=0.01)
    async for batch in stream:
        if isinstance(batch[0], TextDelta):
            break
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(cancelled.wait(), timeout=2)


def test_merge_keeps_choices_apart_and_never_crosses_other_events() -> None:
    call = ToolCallDelta(id="c1", name="f", arguments="{}")
    done = GenerationDone(prompt_tokens=1, completion_tokens=4)
    events = [
        TextDelta(0, text="a", completion_tokens=1),
        TextDelta(1, text="x", completion_tokens=1),
        TextDelta(0, reasoning="", text="b", completion_tokens=2, finish_reason="stop"),
        TextDelta(1, tool_calls=[call], completion_tokens=2, finish_reason="tool_calls"),
        done,
        TextDelta(0, text="late", completion_tokens=3),
    ]
    assert merge_deltas(events) == [
        TextDelta(0, text="ab", completion_tokens=2, finish_reason="stop"),
        TextDelta(1, text="x", tool_calls=[call], completion_tokens=2, finish_reason="tool_calls"),
        done,
        TextDelta(0, text="late", completion_tokens=3),
    ]


def test_merge_does_not_extend_a_finished_choice() -> None:
    first = TextDelta(0, text="end", completion_tokens=1, finish_reason="stop")
    second = TextDelta(0, text="again", completion_tokens=1)
    assert merge_deltas([first, second]) == [first, second]


async def test_events_that_arrive_while_a_batch_is_out_are_not_lost() -> None:
    started = HeadStarted(prompt_tokens=1, max_tokens=3)
    done = GenerationDone(prompt_tokens=1, completion_tokens=3)
    windows = _Windows()
    seen: list[Any] = []
    ended = asyncio.Event()

    async def produce() -> AsyncIterator[Any]:
        try:
            yield started
            yield _token(0)
            yield _token(1)
            await windows.opened(1)
            windows.close()
            await until(lambda: _token(1) in seen)  # the batch is out with the consumer
            yield _token(2)
            yield done
        finally:
            ended.set()

    async for batch in coalesce(produce(), interval_s=0.001, timer=windows):
        seen.extend(batch)
        if _token(1) in batch:
            await ended.wait()  # a slow consumer: the producer ends meanwhile
    assert seen == [started, _token(0), _token(1), _token(2), done]


async def test_no_wake_ups_while_no_token_comes() -> None:
    """The window opens on an event: a slow stream is not polled every window."""
    windows: list[float] = []

    def window() -> float:
        windows.append(1.0)
        return 0.001

    started = HeadStarted(prompt_tokens=1, max_tokens=3)
    events = [(0, started), *_tokens(3, 0.05), (0.0, GenerationDone(1, 3))]
    batches = await _collect(coalesce(_timed(events), window))
    assert len(windows) <= 3  # one per batch after the first token, not one per 1 ms
    assert sum(isinstance(e, TextDelta) for b in batches for e in b) == 3


async def test_the_window_is_read_per_batch() -> None:
    widths = iter([0.2, 0.0, 0.0])
    read: list[float] = []

    def interval() -> float:
        read.append(next(widths, 0.0))
        return read[-1]

    started = HeadStarted(prompt_tokens=1, max_tokens=7)
    done = GenerationDone(1, 7)
    windows = _Windows()
    batches: list[list[Any]] = []

    async def produce() -> AsyncIterator[Any]:
        yield started
        yield _token(0)
        yield _token(1)
        await windows.opened(1)  # the 200 ms window gathers the next four
        for i in range(2, 6):
            await asyncio.sleep(0)
            yield _token(i)
        windows.close()
        await until(lambda: len(batches) == 3)
        yield _token(6)  # a zero window: sent as it is read, no timer
        await until(lambda: len(batches) == 4)
        yield done

    async for batch in coalesce(produce(), interval, timer=windows):
        batches.append(batch)
    assert batches == [[started], [_token(0)], [_merged(1, 5)], [_token(6)], [done]]
    assert read == [0.2, 0.0, 0.0]  # once per batch after the first token
    assert windows.widths == [0.2]


def test_the_window_widens_with_the_streams_in_flight_between_its_bounds() -> None:
    load = StreamLoad(min_s=0.02, max_s=0.2, messages_per_s=100)
    assert load.window() == 0.02  # nothing streaming: the minimum
    load.streaming = 1
    assert load.window() == 0.02  # one stream alone keeps the minimum
    load.streaming = 8
    assert load.window() == pytest.approx(0.08)  # 8 streams share 100 messages/s
    load.streaming = 64
    assert load.window() == 0.2  # never wider than the maximum
    assert StreamLoad(0.02, 0.2, messages_per_s=0).window() == 0.02  # adaptivity off


def test_merge_keeps_every_tokens_logprobs_in_order() -> None:
    def chat(token: str) -> dict[str, Any]:
        return {"content": [{"token": token, "logprob": -0.5, "top_logprobs": []}]}

    completion_a = {"tokens": ["a"], "token_logprobs": [-0.1], "text_offset": [0]}
    completion_b = {"tokens": ["b"], "token_logprobs": [-0.2], "text_offset": [1]}
    events = [
        TextDelta(0, "a", completion_tokens=1, logprobs=chat("a")),
        TextDelta(0, "b", completion_tokens=2, logprobs=None),
        TextDelta(0, "c", completion_tokens=3, logprobs=chat("c")),
        TextDelta(1, "a", completion_tokens=1, logprobs=completion_a),
        TextDelta(1, "b", completion_tokens=2, logprobs=completion_b),
    ]
    first, second = merge_deltas(events)
    assert [e["token"] for e in first.logprobs["content"]] == ["a", "c"]
    assert second.logprobs == {
        "tokens": ["a", "b"],
        "token_logprobs": [-0.1, -0.2],
        "text_offset": [0, 1],
    }
