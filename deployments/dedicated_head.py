"""The head of a dedicated endpoint: a chat head that says which replica served a call.

Same ``ChatHeadCore`` and engine factory as ``deployments.chat.head.ChatHead``;
three additions the dedicated monitoring records need from the replica itself:

- every stream starts with a ``ServedBy`` event (the gateway strips it), so
  per-replica ``calls_total`` and cold waits are measured, not guessed;
- ``stats()`` reports tokens produced, age and in-flight calls for replica
  health (the gateway only calls it on replicas that are already running);
- ``record_autoscaling_stats`` reports the engine's waiting queue for the
  ``engine_target_waiting`` knob (see ``serve_app.dedicated.control.autoscaling``).

The last two come from ``deployments.replica_counters``, shared with ``PoolingHead``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from deployments.chat.head import ChatHeadCore
from deployments.direct_http import refuse_direct_http
from deployments.replica_counters import ReplicaCounters
from deployments.replica_logging import configure_replica_logging
from deployments.stream_batching import coalesce
from serve_app.contract.chat import GenerationDone, HeadEvent, HeadRequest
from serve_app.contract.dedicated import ReplicaStats, ServedBy

logger = logging.getLogger(__name__)


@serve.deployment(ray_actor_options={"num_cpus": 1})
class DedicatedHead:
    """One replica of a ``ded-<slug>`` application."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits async constructors
        self,
        model_id: str,
        backend: str,
        engine_config: dict[str, Any],
        peers: Any = None,
    ) -> None:
        """``peers`` only binds hybrid's ``burst`` deployment into the same app (unused)."""
        configure_replica_logging()
        from deployments import registry

        self.model_id = model_id
        self.counters = ReplicaCounters.in_replica(engine_config)
        self.core = ChatHeadCore(registry.build_engine("chat", backend, engine_config))
        info = await self.core.start()
        logger.info("dedicated head %s ready (max_model_len=%d)", model_id, info.max_model_len)

    async def generate(self, request: HeadRequest) -> AsyncIterator[list[HeadEvent | ServedBy]]:
        """``ServedBy`` first, then the core's events in batches (as ``ChatHead``)."""
        yield [ServedBy(self.counters.replica_id)]
        with self.counters.call():
            async for batch in coalesce(self.core.generate(request)):
                for event in batch:
                    if isinstance(event, GenerationDone):
                        self.counters.tokens += event.completion_tokens
                yield batch

    async def stats(self) -> ReplicaStats:
        return self.counters.stats()

    def record_autoscaling_stats(self) -> dict[str, float]:
        return self.counters.autoscaling_metrics()

    async def __call__(self, request: Any) -> Any:
        """HTTP sent to this replica itself: a 404 envelope, never a model call
        (``deployments.direct_http``)."""
        return refuse_direct_http()

    async def check_health(self) -> None:
        await self.core.engine.check_health()

    async def __del__(self) -> None:
        await self.core.engine.shutdown()
