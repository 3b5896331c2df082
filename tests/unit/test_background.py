"""The periodic loop every background poller of a gateway replica runs on."""

from __future__ import annotations

import asyncio
import logging

import pytest

from serve_app.background import PeriodicLoop
from tests.fixtures.waiting import until

logger = logging.getLogger("test.background")


async def test_a_failed_step_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    async def step() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise ValueError("first period fails")

    loop = PeriodicLoop(step, 0.01, logger=logger, failure="step failed", level=logging.WARNING)
    with caplog.at_level(logging.WARNING, logger="test.background"):
        loop.start()
        loop.start()  # idempotent: still one loop
        await until(lambda: len(calls) >= 3)
        await loop.stop()
    failed = [r for r in caplog.records if r.message == "step failed"]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert not loop.running
    count = len(calls)
    await asyncio.sleep(0.05)
    assert len(calls) == count  # nothing runs after stop


async def test_a_step_answering_false_ends_the_loop_until_the_next_start() -> None:
    calls = 0

    async def step() -> bool:
        nonlocal calls
        calls += 1
        return calls % 2 == 1  # the second call ends the loop

    loop = PeriodicLoop(step, 0.0, logger=logger, failure="x")
    loop.start()
    await until(lambda: not loop.running)
    assert calls == 2
    loop.start()
    await until(lambda: not loop.running)
    assert calls == 4


async def test_wake_ends_the_wait_and_wait_first_delays_the_first_step() -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1

    loop = PeriodicLoop(step, 60.0, logger=logger, failure="x", wait_first=True)
    loop.start()
    await asyncio.sleep(0.02)
    assert calls == 0  # still in its first wait
    loop.wake()
    await until(lambda: calls == 1)
    loop.wake()
    await until(lambda: calls == 2)
    await loop.stop()


async def test_the_interval_is_read_before_each_wait() -> None:
    waits: list[float] = []

    def interval() -> float:
        waits.append(0.0 if len(waits) < 3 else 60.0)
        return waits[-1]

    async def step() -> None:
        return None

    loop = PeriodicLoop(step, interval, logger=logger, failure="x")
    loop.start()
    await until(lambda: len(waits) == 4)  # three waits of nothing, then the long one
    await loop.stop()
    assert waits == [0.0, 0.0, 0.0, 60.0]


async def test_an_outage_is_logged_once_then_its_end(caplog: pytest.LogCaptureFixture) -> None:
    """Steps failing with the same error (a database outage) log one traceback, not one per
    step; a different error is logged again; the first success says how many failed."""
    errors: list[Exception] = [ConnectionError("down")] * 5 + [ValueError("other")]
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        if errors:
            raise errors.pop(0)

    loop = PeriodicLoop(step, 0.001, logger=logger, failure="step failed", level=logging.WARNING)
    with caplog.at_level(logging.WARNING, logger="test.background"):
        loop.start()
        await until(lambda: calls >= 8)
        await loop.stop()
    failed = [r for r in caplog.records if r.message == "step failed"]
    assert [type(r.exc_info[1]) for r in failed if r.exc_info] == [ConnectionError, ValueError]
    recovered = [r.message for r in caplog.records if "recovered" in r.message]
    assert recovered == ["step failed: recovered after 6 failed steps"]
