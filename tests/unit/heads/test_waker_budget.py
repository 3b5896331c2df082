"""The waker asks the memory budget keeper first; readiness tells it of every call."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from serve_app.heads.budget import BudgetHead, BudgetKeeper, KeeperTiming
from serve_app.heads.waker import HeadWaker
from serve_app.inference.readiness import ASLEEP, HeadReadiness, HeadState
from tests.fixtures.waiting import GUARD_S


class _Handle:
    def __init__(self) -> None:
        self.calls = 0
        self.wake = SimpleNamespace(remote=self._remote)

    def _remote(self) -> asyncio.Future[None]:
        self.calls += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class _Clock:
    """The keeper's clock and sleep: a poll moves time on at once (no real waiting)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


class _Orders:
    def __init__(self) -> None:
        self.ordered: list[str] = []

    def order(self, model_id: str, for_model: str) -> None:
        self.ordered.append(model_id)

    def clear(self, model_id: str) -> None:
        return None


def _keeper(awake: set[str], orders: _Orders, budget: float) -> BudgetKeeper:
    heads = {
        "chat": BudgetHead("chat", 2.0, evictable=False),
        "tools": BudgetHead("tools", 6.0, evictable=True),
        "embed": BudgetHead("embed", 2.0, evictable=True),
    }

    def seen() -> set[str]:
        return awake - set(orders.ordered)  # Serve takes an ordered idle head down

    clock = _Clock()
    return BudgetKeeper(
        heads,
        budget,
        seen,
        orders,
        clock=clock,
        sleep=clock.sleep,
        timing=KeeperTiming(poll_s=0.01, deadline_s=0.5),
    )


async def _attempt_ended(waker: HeadWaker, model_id: str) -> None:
    """Until the waker's attempt (the gate, then the wake call or not) is over: what it
    did is then final, however long a busy machine took."""
    await asyncio.wait_for(waker._pending[model_id], GUARD_S)


@pytest.mark.parametrize(("budget", "wakes", "evicted"), [(9, 1, ["embed"]), (7, 0, [])])
async def test_the_wake_call_goes_only_once_there_is_room(
    budget: float, wakes: int, evicted: list[str]
) -> None:
    orders, handle = _Orders(), _Handle()
    keeper = _keeper({"chat", "embed"}, orders, budget)
    sent: list[str] = []
    refused: list[str] = []
    waker = HeadWaker(
        {"tools": handle},
        bound_s=5,
        gate=keeper.make_room,
        on_sent=sent.append,
        on_refused=refused.append,
    )
    waker("tools")
    await _attempt_ended(waker, "tools")
    assert handle.calls == wakes
    assert orders.ordered == evicted
    assert sent == ["tools"] * wakes  # the wake's own time starts only when it is sent
    assert refused == ["tools"] * (1 - wakes)  # and a refusal is told, so it times nothing


async def test_a_failing_gate_keeps_the_head_asleep() -> None:
    async def broken(model_id: str) -> bool:
        raise RuntimeError("database down")

    handle = _Handle()
    refused: list[str] = []
    waker = HeadWaker({"tools": handle}, bound_s=5, gate=broken, on_refused=refused.append)
    waker("tools")
    await _attempt_ended(waker, "tools")
    assert handle.calls == 0 and refused == ["tools"]


async def test_readiness_reports_each_accepted_call_as_a_use() -> None:
    used: list[str] = []
    readiness = HeadReadiness(lambda: {"s": HeadState(ASLEEP)}, refresh_s=0.01, on_use=used.append)
    readiness.note_answering("s")
    readiness.note_answering("t")
    assert used == ["s", "t"]
