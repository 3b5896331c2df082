"""The head of a dedicated endpoint: a chat head that says which replica served a call.

Same ``ChatHeadCore`` and engine factory as ``deployments.text.head.ChatHead``;
three additions the dedicated monitoring records need from the replica itself:

- every stream starts with a ``ServedBy`` event (the gateway strips it), so
  per-replica ``calls_total`` and cold waits are measured, not guessed;
- ``stats()`` reports tokens produced, age and in-flight calls for replica
  health (the gateway only calls it on replicas that are already running);
- ``record_autoscaling_stats`` reports the engine's waiting queue for the
  ``engine_target_waiting`` knob (see ``serve_app.dedicated.control.autoscaling``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from deployments.direct_http import refuse_direct_http
from deployments.replica_logging import configure_replica_logging
from deployments.stream_batching import coalesce
from deployments.text.head import ChatHeadCore
from serve_app.contract.dedicated import ReplicaStats, ServedBy
from serve_app.contract.text import GenerationDone, HeadEvent, HeadRequest

logger = logging.getLogger(__name__)


def queue_split(in_flight: int, max_num_seqs: int | None) -> tuple[int, int | None]:
    """(running, waiting): the engine runs at most ``max_num_seqs`` at once, the rest wait."""
    if max_num_seqs is None:
        return in_flight, None
    return min(in_flight, max_num_seqs), max(0, in_flight - max_num_seqs)


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
        from deployments.text.factory import build_text_engine

        self.model_id = model_id
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.started = time.monotonic()
        seqs = engine_config.get("max_num_seqs")
        self.max_num_seqs = int(seqs) if isinstance(seqs, int) else None
        self.tokens = 0
        self.calls = 0
        self.in_flight = 0
        self.core = ChatHeadCore(build_text_engine(backend, engine_config))
        info = await self.core.start()
        logger.info("dedicated head %s ready (max_model_len=%d)", model_id, info.max_model_len)

    async def generate(self, request: HeadRequest) -> AsyncIterator[list[HeadEvent | ServedBy]]:
        """``ServedBy`` first, then the core's events in batches (as ``ChatHead``)."""
        yield [ServedBy(self.replica_id)]
        self.calls += 1
        self.in_flight += 1
        try:
            async for batch in coalesce(self.core.generate(request)):
                for event in batch:
                    if isinstance(event, GenerationDone):
                        self.tokens += event.completion_tokens
                yield batch
        finally:
            self.in_flight -= 1

    async def stats(self) -> ReplicaStats:
        running, waiting = queue_split(self.in_flight, self.max_num_seqs)
        return ReplicaStats(
            replica_id=self.replica_id,
            age_s=time.monotonic() - self.started,
            tokens=self.tokens,
            calls=self.calls,
            running=running,
            waiting=waiting,
        )

    def record_autoscaling_stats(self) -> dict[str, float]:
        _, waiting = queue_split(self.in_flight, self.max_num_seqs)
        return {"engine_waiting": float(waiting or 0)}

    async def __call__(self, request: Any) -> Any:
        """HTTP sent to this replica itself: a 404 envelope, never a model call
        (``deployments.direct_http``)."""
        return refuse_direct_http()

    async def check_health(self) -> None:
        await self.core.engine.check_health()

    async def __del__(self) -> None:
        await self.core.engine.shutdown()
