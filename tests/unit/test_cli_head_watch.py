"""`gateway run`'s head-state lines say which head an asleep one was put to sleep for."""

from __future__ import annotations

import time

import pytest

from serve_app.cli import serve as serve_cli
from serve_app.contract.sleep import ORDER_TTL_S, SleepOrder
from serve_app.inference.readiness import ASLEEP, READY, HeadState


class _Orders:
    def __init__(self, order: SleepOrder | None) -> None:
        self.order = order

    def read(self, model_id: str) -> SleepOrder | None:
        return self.order


def _watch(states: dict[str, HeadState], order: SleepOrder | None) -> serve_cli.HeadWatch:
    watch = serve_cli.HeadWatch.__new__(serve_cli.HeadWatch)
    watch._sources = [lambda: states]
    watch._orders = {m: _Orders(order) for m in states}  # type: ignore[misc]
    watch._seen = {}
    return watch


@pytest.mark.parametrize(
    ("age_s", "line"),
    [
        (1.0, "heads: chat awake; tools asleep (put to sleep for vision)"),
        (ORDER_TTL_S + 1, "heads: chat awake; tools asleep"),  # an old order: its idle window
    ],
)
def test_an_evicted_head_is_reported_with_the_head_it_made_room_for(
    monkeypatch: pytest.MonkeyPatch, age_s: float, line: str
) -> None:
    steps: list[str] = []
    monkeypatch.setattr(serve_cli, "_step", steps.append)
    order = SleepOrder(time.time() - age_s, "vision")
    _watch({"chat": HeadState(READY), "tools": HeadState(ASLEEP)}, order).report()
    assert steps == [line]
