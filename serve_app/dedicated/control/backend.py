"""What the reconciler needs from Ray Serve, as a protocol, plus the values it exchanges.

``ServeBackend`` is the reconciler's whole view of Serve: deploy one app,
delete one app, read every app's state, reach a deployment, sample replica
counters, and ask Ray when gone replicas died (``deaths``). The real
implementation (``ray_backend.RayServeBackend``) uses per-application Python
API calls only (never a declarative config, which would delete the ops apps);
unit tests inject a fake with the same surface, so the state machine is tested
without Ray.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from serve_app.contract.dedicated import ReplicaStats
from serve_app.dedicated.control.deaths import ReplicaDeath
from serve_app.dedicated.options import CapacityClass
from serve_app.heads.client import HeadClient, PoolingClient

BOOTING_STATES = frozenset({"STARTING", "UPDATING", "RECOVERING", "RUNNING", "PENDING_MIGRATION"})


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment of a dedicated app; ``options`` go to ``Deployment.options``."""

    name: str
    capacity_class: CapacityClass
    options: dict[str, Any]


@dataclass(frozen=True)
class AppSpec:
    """Everything one ``ded-<slug>`` application is built from."""

    name: str
    model_id: str
    backend: str
    engine_config: dict[str, Any]
    deployments: tuple[DeploymentSpec, ...]
    head: str = "chat"
    """The head kind its replicas run: ``chat`` (``DedicatedHead``) or ``pooling``
    (the pooling head, for embedding and scoring models)."""

    def fingerprint(self) -> str:
        """Stable digest of the app spec: equal digests mean nothing to apply."""
        data: dict[str, Any] = {
            "name": self.name,
            "model": self.model_id,
            "backend": self.backend,
            "engine": self.engine_config,
            "deployments": [[d.name, d.capacity_class, d.options] for d in self.deployments],
        }
        if self.head != "chat":  # chat apps keep the digests they were deployed with
            data["head"] = self.head
        raw = json.dumps(data, sort_keys=True, default=str).encode()
        return hashlib.sha256(raw).hexdigest()[:32]

    def capacity_class_of(self, deployment: str) -> CapacityClass | None:
        for spec in self.deployments:
            if spec.name == deployment:
                return spec.capacity_class
        return None


@dataclass(frozen=True)
class ReplicaObservation:
    """One replica as Serve reports it; ``node_id`` is set once it holds its resources."""

    replica_id: str
    deployment: str
    state: str
    node_id: str | None = None
    start_time_s: float | None = None
    actor_id: str | None = None
    """The replica's Ray actor: its death is recorded in the GCS actor table."""


@dataclass(frozen=True)
class AppObservation:
    """One application as Serve reports it."""

    name: str
    status: str
    message: str = ""
    replicas: tuple[ReplicaObservation, ...] = ()
    dead_replicas: tuple[ReplicaObservation, ...] = ()
    """Serve's ``recent_dead_replicas``: lives too short to be seen between two reads."""

    @property
    def ready(self) -> int:
        return sum(1 for r in self.replicas if r.state == "RUNNING")

    @property
    def total(self) -> int:
        """Replicas held or booting (``live.replicas_total``); stopping ones are released."""
        return sum(1 for r in self.replicas if r.state in BOOTING_STATES)

    @property
    def failed(self) -> bool:
        return self.status.endswith("DEPLOY_FAILED")

    @property
    def running(self) -> bool:
        return self.status.endswith("RUNNING")

    def ready_in(self, deployment: str) -> int:
        return sum(1 for r in self.replicas if r.deployment == deployment and r.state == "RUNNING")


class ServeBackend(Protocol):
    """Per-application operations on Ray Serve (blocking; the reconciler calls them off-loop)."""

    def deploy(self, spec: AppSpec) -> None: ...

    def delete(self, app_name: str) -> None: ...

    def status(self) -> dict[str, AppObservation]: ...

    def head_client(self, app_name: str, deployment: str, model_id: str) -> HeadClient: ...

    def pooling_client(self, app_name: str, deployment: str, model_id: str) -> PoolingClient:
        """A client on a pooling endpoint's deployment (``embed``, ``score``)."""
        ...

    async def sample(self, app_name: str, deployment: str, replicas: int) -> list[ReplicaStats]: ...

    def deaths(self, replicas: Sequence[ReplicaObservation]) -> dict[str, ReplicaDeath]:
        """Replica id -> when Ray recorded its end, for those it has a record of."""
        ...
