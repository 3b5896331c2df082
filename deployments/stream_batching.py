"""Coalescing a head's event stream into batches before it crosses a DeploymentHandle.

Every item a Ray Serve streaming call yields is its own object and its own
message to the caller, and the gateway turns each into its own SSE write back
through the Serve proxy: one token meant two inter-process hops. On a loaded
box those hops, not the gateway's logic, were most of the added latency (see
bench/RESULTS.md). So heads yield *lists* of events:

- events up to and including the first text are sent one by one, at once: the
  gateway needs ``HeadStarted`` to admit the request against the limits before
  anything is generated for a caller who may be refused, and time to first
  token must not wait for a batch window;
- after that, whatever the engine produced within ``interval_s`` goes as one
  list, with adjacent deltas of the same choice merged into one (``None``: the
  rest of the answer in one list, for callers that do not stream).

This mirrors Ray Serve LLM's stream batching (``stream_batching_interval_ms``),
with the first-token exception added.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from serve_app.contract.chat import TextDelta, merge_logprobs

DEFAULT_INTERVAL_S = 0.02
"""Batch window while streaming: ~50 flushes per second per stream at most."""
DEFAULT_MAX_INTERVAL_S = 0.2
"""The widest window load may open (5 flushes per second per stream)."""
DEFAULT_MESSAGES_PER_S = 100.0
"""Messages per second a head replica aims to send at most, all its streams together."""

_END = object()


class StreamLoad:
    """The batch window of one head replica, widened with the streams it is sending.

    Each stream past its first token flushes at most once per window. With ``n``
    of them the replica sends about ``n / window`` messages a second, and every
    message costs CPU in three processes (head, gateway, Serve proxy) whatever it
    carries. Under load, when tokens queue behind a busy CPU anyway, the window
    grows to ``n / messages_per_s`` (between ``min_s`` and ``max_s``), so more
    streams mean more tokens per message rather than more messages. One stream
    alone keeps ``min_s``; ``messages_per_s=0`` keeps ``min_s`` always.
    """

    def __init__(
        self,
        min_s: float = DEFAULT_INTERVAL_S,
        max_s: float = DEFAULT_MAX_INTERVAL_S,
        messages_per_s: float = DEFAULT_MESSAGES_PER_S,
    ) -> None:
        self.min_s = min_s
        self.max_s = max(min_s, max_s)
        self.messages_per_s = messages_per_s
        self.streaming = 0
        """Streams past their first token and not finished."""

    def window(self) -> float:
        if self.messages_per_s <= 0:
            return self.min_s
        return min(self.max_s, max(self.min_s, self.streaming / self.messages_per_s))


def merge_deltas(events: list[Any]) -> list[Any]:
    """Fold each run of consecutive ``TextDelta``s into one delta per choice.

    A run is broken by any other event, so ordering against ``HeadStarted``,
    ``GenerationDone`` or a failure is kept; inside a run each choice keeps its
    own order (text, reasoning and tool calls are concatenated, the finish
    reason and the cumulative token count are the last ones).
    """
    merged: list[Any] = []
    open_run: dict[int, int] = {}  # choice -> position in ``merged`` of its delta in this run
    for event in events:
        if not isinstance(event, TextDelta):
            open_run.clear()
            merged.append(event)
            continue
        at = open_run.get(event.choice_index)
        if at is None or merged[at].finish_reason is not None:
            open_run[event.choice_index] = len(merged)
            merged.append(event)
            continue
        before: TextDelta = merged[at]
        merged[at] = replace(
            before,
            text=before.text + event.text,
            reasoning=before.reasoning + event.reasoning,
            tool_calls=[*before.tool_calls, *event.tool_calls],
            finish_reason=event.finish_reason,
            completion_tokens=max(before.completion_tokens, event.completion_tokens),
            logprobs=merge_logprobs([p for p in (before.logprobs, event.logprobs) if p]),
        )
    return merged


def _is_content(event: Any) -> bool:
    return isinstance(event, TextDelta)


Interval = float | None | Callable[[], float | None]
"""A batch window in seconds, ``None`` for "the rest at once", or a function read per batch."""

Timer = Callable[[float], asyncio.Timeout]
"""What ends a window after its width: ``asyncio.timeout``; tests pass one they end
themselves, so which events share a batch never depends on the machine's speed."""


class _Pump:
    """The producer read in a task into a queue, with the waits ``coalesce`` needs."""

    def __init__(self, events: AsyncIterator[Any]) -> None:
        self.queue: collections.deque[Any] = collections.deque()
        self.ready = asyncio.Event()  # an event is queued, or the producer ended
        self.finished = asyncio.Event()
        self.reader = asyncio.create_task(self._pump(events))

    async def _pump(self, events: AsyncIterator[Any]) -> None:
        try:
            async for event in events:
                self.queue.append(event)
                self.ready.set()
        finally:
            self.finished.set()
            self.ready.set()

    async def next_event(self) -> Any:
        """The next event, or ``_END`` once the producer finished and nothing is left."""
        while not self.queue:
            if self.reader.done():
                self.reader.result()
                return _END
            self.ready.clear()
            await self.ready.wait()
        return self.queue.popleft()

    async def wait_window(self, window: float | None, timer: Timer) -> None:
        """Once an event is there: ``window`` seconds more (``None``: the producer's end)."""
        if not self.finished.is_set():
            if window is None:
                await self.finished.wait()
            elif window > 0:
                with contextlib.suppress(TimeoutError):
                    async with timer(window):
                        await self.finished.wait()

    def drain(self) -> tuple[list[Any], bool]:
        """Everything queued, and whether the producer had ended when it was taken.

        While the batch is out the producer may still add (and end); those events go
        in the next batch, not lost.
        """
        self.ready.clear()
        batch = list(self.queue)
        self.queue.clear()
        return batch, self.reader.done()

    async def close(self) -> None:
        if not self.reader.done():
            self.reader.cancel()  # the consumer left: cancel the producer (the engine aborts)
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader


async def coalesce(
    events: AsyncIterator[Any],
    interval_s: Interval = DEFAULT_INTERVAL_S,
    *,
    eager_until: Callable[[Any], bool] = _is_content,
    timer: Timer = asyncio.timeout,
) -> AsyncIterator[list[Any]]:
    """Yield ``events`` as lists (see the module docstring); errors surface after a flush.

    A window opens when an event arrives, not on a clock: a stream whose tokens are
    sparser than the window costs no wake-ups between them. ``interval_s`` may be a
    function, read as each window opens, so a head can widen it under load.
    """
    pump = _Pump(events)
    try:
        eager = True
        while eager:  # one by one until the first content event
            event = await pump.next_event()
            if event is _END:
                return
            eager = not eager_until(event)
            yield [event]
        while True:
            await pump.ready.wait()  # the window opens with an event, read as it opens
            await pump.wait_window(interval_s() if callable(interval_s) else interval_s, timer)
            batch, ended = pump.drain()
            if batch:
                yield merge_deltas(batch)
            if ended:
                pump.reader.result()  # re-raise what the producer raised, after its output
                return
    finally:
        await pump.close()
