"""Per-replica counters a dedicated endpoint's monitoring samples from its heads.

The gateway measures calls from outside (telemetry); what only the replica knows
is how much its engine has worked and how many calls wait in it. Chat heads
(``DedicatedHead``: completion tokens) and pooling heads (``PoolingHead``: input
tokens, the only tokens an encoder processes) keep the same counters, so
``GET /api/dedicated/{id}/health`` and the ``engine_target_waiting`` scaling knob
read both kinds alike (``serve_app.dedicated.control.autoscaling``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from serve_app.contract.dedicated import ReplicaStats

ENGINE_WAITING_METRIC = "engine_waiting"
"""The custom autoscaling metric's name (the policy reads the same string)."""


def queue_split(in_flight: int, max_num_seqs: int | None) -> tuple[int, int | None]:
    """(running, waiting): the engine runs at most ``max_num_seqs`` at once, the rest wait."""
    if max_num_seqs is None:
        return in_flight, None
    return min(in_flight, max_num_seqs), max(0, in_flight - max_num_seqs)


@dataclass
class ReplicaCounters:
    """``in_flight`` counts sequences in the engine; ``tokens`` what the engine worked on."""

    replica_id: str
    max_num_seqs: int | None
    started: float = field(default_factory=time.monotonic)
    tokens: int = 0
    calls: int = 0
    in_flight: int = 0

    @classmethod
    def in_replica(
        cls, engine_config: dict[str, Any], default_max_num_seqs: int | None = None
    ) -> ReplicaCounters:
        """Counters of the Serve replica this runs in; ``max_num_seqs`` from the engine
        config (the engine's own default where the config leaves it out)."""
        from ray import serve

        seqs = engine_config.get("max_num_seqs", default_max_num_seqs)
        return cls(
            replica_id=serve.get_replica_context().replica_id.unique_id,
            max_num_seqs=int(seqs) if isinstance(seqs, int) else None,
        )

    @contextlib.contextmanager
    def call(self, sequences: int = 1) -> Iterator[None]:
        """One call in the engine, counted at once; its ``sequences`` are in flight until it
        ends (a chat call is one sequence, an embedding call one per input, since the
        engine's ``max_num_seqs`` bounds inputs, not calls)."""
        self.calls += 1
        self.in_flight += sequences
        try:
            yield
        finally:
            self.in_flight -= sequences

    def stats(self) -> ReplicaStats:
        running, waiting = queue_split(self.in_flight, self.max_num_seqs)
        return ReplicaStats(
            replica_id=self.replica_id,
            age_s=time.monotonic() - self.started,
            tokens=self.tokens,
            calls=self.calls,
            running=running,
            waiting=waiting,
        )

    def autoscaling_metrics(self) -> dict[str, float]:
        _, waiting = queue_split(self.in_flight, self.max_num_seqs)
        return {ENGINE_WAITING_METRIC: float(waiting or 0)}
