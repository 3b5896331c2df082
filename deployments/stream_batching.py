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
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from serve_app.contract.text import TextDelta

DEFAULT_INTERVAL_S = 0.02
"""Batch window while streaming: ~50 flushes per second per stream at most."""

_END = object()


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
        )
    return merged


def _is_content(event: Any) -> bool:
    return isinstance(event, TextDelta)


async def coalesce(
    events: AsyncIterator[Any],
    interval_s: float | None = DEFAULT_INTERVAL_S,
    *,
    eager_until: Callable[[Any], bool] = _is_content,
) -> AsyncIterator[list[Any]]:
    """Yield ``events`` as lists (see the module docstring); errors surface after a flush."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    finished = asyncio.Event()

    async def pump() -> None:
        try:
            async for event in events:
                queue.put_nowait(event)
        finally:
            finished.set()

    reader = asyncio.create_task(pump())
    try:
        eager = True
        while eager:  # one by one until the first content event
            event = await _next(queue, reader)
            if event is _END:
                return
            eager = not eager_until(event)
            yield [event]
        while True:
            if interval_s is None:
                await finished.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), timeout=interval_s)
            batch = _drain(queue)
            if batch:
                yield merge_deltas(batch)
            if reader.done():
                reader.result()  # re-raise what the producer raised, after its output
                return
    finally:
        if not reader.done():
            reader.cancel()  # the consumer left: cancel the producer (the engine aborts)
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def _next(queue: asyncio.Queue[Any], reader: asyncio.Task[None]) -> Any:
    """The next event, or ``_END`` once the producer finished and nothing is left."""
    while True:
        if not queue.empty():
            return queue.get_nowait()
        if reader.done():
            reader.result()
            return _END
        getter = asyncio.ensure_future(queue.get())
        await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()


def _drain(queue: asyncio.Queue[Any]) -> list[Any]:
    items: list[Any] = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items
