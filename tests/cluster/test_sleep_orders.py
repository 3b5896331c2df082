"""Sleep orders on a real Ray Serve: the heads' autoscaling policy in Serve's controller.

The memory budget keeper (serve_app/heads/budget.py) is unit-tested alone; this checks the
half that only a real controller can: the policy (deployments/sleep_policy.py) is loaded
there, reads the order from Ray's KV, scales an idle head to zero at once, keeps a head
with a call in flight up until the call ends, and ignores the order once a call woke the
head again. A tiny deployment stands for a head (no model). ~1 min.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator

import pytest

pytestmark = pytest.mark.cluster

APP = "budget-e2e"
HEADS = {"tiny": "Tiny"}
SHIPPED = {
    "min_replicas": 0,
    "initial_replicas": 1,
    "max_replicas": 1,
    "upscale_delay_s": 0,
    "downscale_delay_s": 600,
    "downscale_to_zero_delay_s": 600,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def handle() -> Iterator[object]:
    import ray
    from ray import serve

    from deployments.sleep_policy import with_sleep_policy

    @serve.deployment(name="Tiny", autoscaling_config=with_sleep_policy(SHIPPED))
    class Tiny:
        async def __call__(self, seconds: float = 0.0) -> str:
            await asyncio.sleep(seconds)
            return "ok"

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": _free_port()})
        yield serve.run(Tiny.bind(), name=APP, route_prefix=None)
    finally:
        serve.shutdown()
        ray.shutdown()


def _state() -> str:
    from serve_app.inference.readiness import serve_status_source

    return serve_status_source(APP, HEADS)()["tiny"].state


def _within(seconds: float, condition: Callable[[], bool]) -> float:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if condition():
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"not within {seconds} s (state {_state()})")


def test_an_order_puts_an_idle_head_to_sleep_and_a_call_wakes_it(handle: object) -> None:
    from serve_app.heads.sleep_orders import RaySleepOrders
    from serve_app.inference.readiness import ASLEEP, READY

    assert handle.remote().result(timeout_s=60) == "ok"  # type: ignore[attr-defined]
    _within(30, lambda: _state() == READY)
    orders = RaySleepOrders(APP, HEADS)
    orders.order("tiny", "bigger-head")
    # Serve's request count is averaged over look_back_period_s (30 s): the first call
    # still counts for up to that long
    took = _within(75, lambda: _state() == ASLEEP)
    print(f"asleep {took:.1f} s after the order")
    order = orders.read("tiny")
    assert order is not None and order.for_model == "bigger-head"
    assert handle.remote().result(timeout_s=60) == "ok"  # type: ignore[attr-defined]
    time.sleep(8)  # the order is older than this wake: void
    assert _state() == READY


def test_a_head_with_a_call_in_flight_is_not_put_to_sleep(handle: object) -> None:
    from serve_app.heads.sleep_orders import RaySleepOrders
    from serve_app.inference.readiness import ASLEEP, READY

    _within(60, lambda: _state() == READY)
    slow = handle.remote(12.0)  # type: ignore[attr-defined]
    time.sleep(2)
    RaySleepOrders(APP, HEADS).order("tiny", "bigger-head")
    time.sleep(7)
    assert _state() == READY  # the call is still running
    assert slow.result(timeout_s=60) == "ok"
    _within(75, lambda: _state() == ASLEEP)  # idle now: the order holds
