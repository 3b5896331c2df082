"""What a dedicated endpoint's head (``deployments.dedicated_head``) sends the gateway.

Both cross a DeploymentHandle: ``ServedBy`` leads every dedicated stream (the
gateway's router strips it and records the replica that served the call), and
``ReplicaStats`` answers ``stats()`` when the gateway samples replica health.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServedBy:
    """First item of every dedicated stream: the replica that took the call."""

    replica_id: str


@dataclass
class ReplicaStats:
    """One replica's counters, sampled for ``GET /api/dedicated/{id}/health``."""

    replica_id: str
    age_s: float
    tokens: int
    calls: int
    running: int
    waiting: int | None
