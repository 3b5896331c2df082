"""The autoscaling policy of heads that sleep: idle window, and sleep orders from the gateway.

Serve's default policy scales a head to zero ``downscale_to_zero_delay_s`` after its last
request. This policy keeps that idle window itself (``idle_s``) and adds one thing: a
sleep order from the gateway's memory budget keeper (``serve_app.heads.budget``, through
Ray's internal key-value store: ``serve_app.contract.sleep``) scales the head to zero at
once, but only while Serve counts no request running or queued for it, here in the
controller where the count is exact across every gateway replica. A busy head ignores
the order; the keeper sees it stay up and chooses another.

Serve wraps every custom policy in its delay logic, so the builder sets the head's
``downscale_to_zero_delay_s`` to ``ZERO_DELAY_S`` and hands the original idle window to
this policy (``serve_app.builders``). Serve's cold-start path (a call queued for a head
with no replica) runs before any policy: a call always wakes a sleeping head.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from serve_app.contract.sleep import NAMESPACE, SleepOrder, order_key

logger = logging.getLogger("ray.serve")
"""Serve's own logger: in the controller its lines go to the controller's log file."""

ZERO_DELAY_S = 1.0
ORDER_READ_S = 1.0
"""Orders are read from the GCS at most this often per head (the control loop ticks faster)."""

OrderReader = Callable[[bytes], bytes | None]


def _read_from_gcs(key: bytes) -> bytes | None:
    from ray.experimental.internal_kv import _internal_kv_get

    value = _internal_kv_get(key, namespace=NAMESPACE)
    return value if isinstance(value, bytes) else None


class SleepPolicy:
    """A class policy: Serve builds one per deployment config and calls it every tick."""

    def __init__(
        self, idle_s: float | None = None, order_reader: OrderReader | None = None
    ) -> None:
        """``idle_s``: sleep after this long without a request; None: only when ordered."""
        self.idle_s = idle_s
        self._read = order_reader or _read_from_gcs
        self._last_busy: float | None = None
        self._order: SleepOrder | None = None
        self._order_read_at = float("-inf")
        self._told = False

    def __call__(self, ctx: Any) -> tuple[float, dict[str, Any]]:
        now = ctx.current_time or time.time()
        busy = ctx.total_num_requests > 0
        if busy or self._last_busy is None or ctx.current_num_replicas == 0:
            self._last_busy = now  # asleep or starting counts as used: a fresh window
        if ctx.current_num_replicas == 0:
            return ctx.target_num_replicas, {}
        if not busy and self._ordered(ctx, now):
            if self._order is not None and not self._told:
                logger.info(
                    "%s put to sleep for %s (sleep order)",
                    ctx.deployment_name,
                    self._order.for_model,
                )
                self._told = True
            return 0, {}
        self._told = False
        if not busy and self._idle(now):
            return 0, {}
        target = ctx.config.get_target_ongoing_requests() * ctx.current_num_replicas
        desired = ctx.current_num_replicas * ctx.total_num_requests / target
        return max(1.0, desired), {}

    def _idle(self, now: float) -> bool:
        return (
            self.idle_s is not None
            and self._last_busy is not None
            and now - self._last_busy >= self.idle_s
        )

    def _ordered(self, ctx: Any, now: float) -> bool:
        if now - self._order_read_at >= ORDER_READ_S:
            self._order_read_at = now
            key = order_key(ctx.app_name or "", ctx.deployment_name)
            try:
                self._order = SleepOrder.decode(self._read(key))
            except Exception:  # the GCS unreachable for a tick: no order
                logger.warning("could not read the sleep order of %s", key, exc_info=True)
                self._order = None
        # An order older than the head's latest scale-up was carried out already, or given
        # before a call woke the head again: void either way.
        woke = ctx.last_scale_up_time or 0.0
        return self._order is not None and self._order.fresh(now) and self._order.at > woke


POLICY_PATH = "deployments.sleep_policy:SleepPolicy"
DEFAULT_IDLE_S = 600.0


def with_sleep_policy(autoscaling: dict[str, Any], *, pinned: bool = False) -> dict[str, Any]:
    """A head's ``autoscaling_config`` with this policy, when the head sleeps when idle.

    The idle window moves from Serve's ``downscale_to_zero_delay_s`` (else
    ``downscale_delay_s``) into the policy, and Serve's own delay to zero becomes
    ``ZERO_DELAY_S`` so an order takes effect at once. A ``pinned`` head (the catalog's
    ``pinned: true``) gets no idle window: it sleeps only when ordered, which the budget
    keeper does only once its pin is dropped (a budget too small to hold it beside the
    largest sleeping head, ``serve_app.heads.budget.honour_pins``). A config that names its
    own policy, or whose head never scales to zero, is returned as it is.
    """
    if autoscaling.get("min_replicas", 1) != 0 or "policy" in autoscaling:
        return autoscaling
    idle = autoscaling.get("downscale_to_zero_delay_s")
    if idle is None:
        idle = autoscaling.get("downscale_delay_s", DEFAULT_IDLE_S)
    kwargs = {"idle_s": None if pinned else float(idle)}
    return autoscaling | {
        "downscale_to_zero_delay_s": ZERO_DELAY_S,
        "policy": {"policy_function": POLICY_PATH, "policy_kwargs": kwargs},
    }
