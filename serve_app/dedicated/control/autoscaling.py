"""The Ray Serve autoscaling policy of dedicated deployments that need more than Serve's own.

Serve's default policy sizes a deployment by ongoing requests per replica
(``target_ongoing_requests``). Two knobs of the API's scaling policy need
more: ``buffer_replicas`` (hot spares held while traffic flows) and
``engine_target_waiting`` (scale on the engine's waiting queue, reported by
``DedicatedHead.record_autoscaling_stats``). Serve wraps a custom policy with
its own bounds, delays and scale-from-zero path, so this class only adjusts
the desired count.

The controller imports this module by value (cloudpickle), so it must import
nothing from the gateway: only the standard library and ``ray.serve``.
"""

from __future__ import annotations

from typing import Any

ENGINE_WAITING_METRIC = "engine_waiting"


class DedicatedAutoscalingPolicy:
    """Serve's queue-length decision, plus spares under traffic and a waiting-queue trigger."""

    def __init__(self, buffer_replicas: int = 0, engine_target_waiting: int | None = None) -> None:
        self.buffer_replicas = max(0, int(buffer_replicas))
        self.engine_target_waiting = engine_target_waiting

    def __call__(self, ctx: Any) -> tuple[float, dict[str, Any]]:
        from ray.serve.autoscaling_policy import replica_queue_length_autoscaling_policy

        desired, state = replica_queue_length_autoscaling_policy(ctx)
        current = int(ctx.current_num_replicas)
        if self.engine_target_waiting and current > 0:
            metrics = ctx.aggregated_metrics or {}
            waiting = sum(float(v) for v in metrics.get(ENGINE_WAITING_METRIC, {}).values())
            if waiting > self.engine_target_waiting:
                desired = max(float(desired), current + 1.0)
        if self.buffer_replicas and float(ctx.total_num_requests) > 0:
            desired = float(desired) + self.buffer_replicas
        return desired, dict(state or {})
