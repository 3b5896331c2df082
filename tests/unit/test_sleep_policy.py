"""The sleeping heads' autoscaling policy (deployments/sleep_policy.py) under Serve's own
wrapper (delays, bounds, cold start), without a cluster."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from ray.serve import autoscaling_policy
from ray.serve._private.autoscaling_state import _resolve_policy_callable
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from deployments.sleep_policy import SleepPolicy, with_sleep_policy
from serve_app.contract.sleep import ORDER_TTL_S, SleepOrder, order_key

SHIPPED = {
    "min_replicas": 0,
    "initial_replicas": 0,
    "max_replicas": 1,
    "upscale_delay_s": 0,
    "downscale_delay_s": 600,
    "downscale_to_zero_delay_s": 600,
}


class Head:
    """One deployment's policy as the controller runs it, with a clock and an order store."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        autoscaling: dict[str, Any] = SHIPPED,
        pinned: bool = False,
    ):
        self.config = AutoscalingConfig(**with_sleep_policy(autoscaling, pinned=pinned))
        self.orders: dict[bytes, bytes] = {}
        policy = _resolve_policy_callable(self.config.policy)
        assert isinstance(policy, SleepPolicy)
        policy._read = self.orders.get
        self.policy = _apply_autoscaling_config(policy)
        self.state: dict[str, Any] = {}
        self.now = time.time()
        self.replicas = 1
        self.scaled_up_at: float | None = None
        # Serve's delay logic reads the wall clock: give it this head's
        monkeypatch.setattr(autoscaling_policy, "time", SimpleNamespace(time=lambda: self.now))

    def tick(self, requests: float, seconds: float = 1.0) -> int:
        self.now += seconds
        ctx = AutoscalingContext(
            deployment_id=None,  # type: ignore[arg-type]
            deployment_name="chat-tools",
            app_name="gateway",
            current_num_replicas=self.replicas,
            target_num_replicas=self.replicas,
            running_replicas=[],
            total_num_requests=requests,
            total_queued_requests=0,
            aggregated_metrics={},
            raw_metrics={},
            capacity_adjusted_min_replicas=0,
            capacity_adjusted_max_replicas=1,
            policy_state=self.state,
            last_scale_up_time=self.scaled_up_at,
            last_scale_down_time=None,
            current_time=self.now,
            config=self.config,
        )
        decision, self.state = self.policy(ctx)
        replicas = min(1, max(0, int(decision)))
        if replicas > self.replicas:  # what Serve's deployment state records
            self.scaled_up_at = self.now
        self.replicas = replicas
        return self.replicas

    def order(self, at: float | None = None) -> None:
        key = order_key("gateway", "chat-tools")
        self.orders[key] = SleepOrder(self.now if at is None else at, "vision").encode()


def test_the_idle_window_moves_into_the_policy() -> None:
    config = with_sleep_policy(SHIPPED)
    assert config["downscale_to_zero_delay_s"] == 1.0
    assert config["policy"]["policy_kwargs"] == {"idle_s": 600.0}
    fixed = {"min_replicas": 1, "max_replicas": 2}
    assert with_sleep_policy(fixed) is fixed


def test_an_idle_head_sleeps_after_its_window_not_before(monkeypatch: pytest.MonkeyPatch) -> None:
    head = Head(monkeypatch)
    assert head.tick(requests=1) == 1
    for _ in range(590):
        assert head.tick(requests=0) == 1
    assert head.tick(requests=0, seconds=15) == 1  # window over; Serve's 1 s delay to zero
    assert head.tick(requests=0, seconds=2) == 0


def test_an_order_puts_an_idle_head_to_sleep_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    head = Head(monkeypatch)
    head.tick(requests=1)
    head.tick(requests=0)
    assert head.tick(requests=0) == 1  # no order: stays up
    head.order()
    head.tick(requests=0)
    assert head.tick(requests=0, seconds=2) == 0


def test_a_pinned_head_never_sleeps_when_idle_only_when_ordered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert with_sleep_policy(SHIPPED, pinned=True)["policy"]["policy_kwargs"] == {"idle_s": None}
    head = Head(monkeypatch, pinned=True)
    head.tick(requests=1)
    for _ in range(30):
        assert head.tick(requests=0, seconds=60) == 1  # half an hour idle: still awake
    head.order()  # its pin dropped: the budget keeper may order it like any other
    head.tick(requests=0)
    assert head.tick(requests=0, seconds=2) == 0


def test_an_order_never_stops_a_head_with_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    head = Head(monkeypatch)
    head.order()
    for _ in range(10):
        assert head.tick(requests=1) == 1
    head.tick(requests=0)
    assert head.tick(requests=0, seconds=2) == 0  # idle now: the order holds


def test_a_stale_order_is_ignored_and_a_call_wakes_an_ordered_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head = Head(monkeypatch)
    head.order(at=head.now - ORDER_TTL_S - 1)
    for _ in range(5):
        assert head.tick(requests=0) == 1
    head.order()
    head.tick(requests=0)
    assert head.tick(requests=0, seconds=2) == 0
    assert head.tick(requests=1) == 1  # Serve's cold start runs before any policy


def test_an_order_older_than_the_latest_wake_is_void(monkeypatch: pytest.MonkeyPatch) -> None:
    head = Head(monkeypatch)
    head.tick(requests=1)
    head.order()
    head.tick(requests=0)
    assert head.tick(requests=0, seconds=2) == 0  # carried out
    assert head.tick(requests=1) == 1  # woken again by a call, the order still stored
    for _ in range(5):
        assert head.tick(requests=0) == 1  # the old order does not take it down again


def test_the_builder_gives_sleeping_heads_the_policy_and_leaves_the_others() -> None:
    from serve_app.builders import head_application
    from serve_app.cli.serve import _catalog_models, load_serve_config

    models = {m.id: m for m in _catalog_models(load_serve_config("configs/local.yaml"))}

    def autoscaling(model_id: str) -> Any:
        app = head_application(models[model_id])
        assert app is not None
        return app._bound_deployment._deployment_config.autoscaling_config

    tools = autoscaling("qwen2.5-coder-1.5b-instruct")
    assert tools.policy.policy_function == "deployments.sleep_policy:SleepPolicy"
    assert tools.policy.policy_kwargs == {"idle_s": 600.0}
    assert tools.downscale_to_zero_delay_s == 1.0
    chat = autoscaling("smollm2-135m-instruct")  # pinned: awake from the start, no idle window
    assert chat.policy.policy_kwargs == {"idle_s": None}
    assert (chat.min_replicas, chat.initial_replicas) == (0, 1)
    assert autoscaling("tatr").policy.policy_kwargs == {"idle_s": 600.0}
