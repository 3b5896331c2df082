"""``ServeBackend`` on a real Ray Serve instance, through per-application Python API calls.

Never a declarative config: Serve's REST ``PUT`` (``serve deploy``) replaces the
whole set of applications, so deploying one endpoint that way would delete
the ops apps and every other endpoint. ``serve.run(app, name=...)`` and
``serve.delete(name)`` touch exactly one application. Replica-level state
(ids, placement, start time) comes from the controller's instance details,
the same data ``serve status`` and the dashboard show.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from serve_app.contract.dedicated import ReplicaStats
from serve_app.dedicated.control.backend import AppObservation, AppSpec, ReplicaObservation
from serve_app.dedicated.control.deaths import (
    HealthCheckWindow,
    ReplicaDeath,
    actor_death,
    node_death,
)
from serve_app.dedicated.offer.scaling import BURST, HEAD
from serve_app.heads.client import HeadClient, PoolingClient, RayHeadClient
from serve_app.heads.serve_state import serve_details, serve_name

logger = logging.getLogger(__name__)

SAMPLE_TIMEOUT_S = 5.0
GCS_TIMEOUT_S = 5.0


def _deployment(head: Any, options: dict[str, Any]) -> Any:
    """``head`` (``DedicatedHead``; ``PoolingHead`` for a pooling model) with ``options``,
    pinned to its code version.

    Serve 2.60 gives every imperative ``serve.run`` a random code version (so every
    redeploy would restart every replica) and refuses ``version`` from users; the
    ``_internal`` path is the one its own declarative deploys use to pin it. With the
    version pinned, an autoscaling or queue change is a lightweight in-place update,
    while a new engine config (version) or new actor options (capacity class) replace
    the replicas, which is exactly the live-PATCH vs. redeploy split of the API.
    """
    opts = dict(options)
    version = opts.pop("version")
    return head.options(**opts).options(_internal=True, version=version)


def build_application(head: Any, spec: AppSpec) -> Any:
    """The bound app of ``head`` deployments: ``head`` as ingress; in hybrid, ``burst``
    bound into it as a peer."""
    by_name = {d.name: d for d in spec.deployments}
    args = (spec.model_id, spec.backend, spec.engine_config)
    peers = None
    if BURST in by_name:
        peers = _deployment(head, by_name[BURST].options).bind(*args)
    return _deployment(head, by_name[HEAD].options).bind(*args, peers=peers)


def _replicas(app: dict[str, Any], key: str) -> tuple[ReplicaObservation, ...]:
    return tuple(
        ReplicaObservation(
            replica_id=str(r.get("replica_id")),
            deployment=str(dep_name),
            state=serve_name(r.get("state")),
            node_id=r.get("node_id"),
            start_time_s=r.get("start_time_s"),
            actor_id=r.get("actor_id"),
        )
        for dep_name, dep in (app.get("deployments") or {}).items()
        for r in dep.get(key) or []
    )


def observations(details: dict[str, Any]) -> dict[str, AppObservation]:
    """Serve's instance details -> one ``AppObservation`` per application."""
    return {
        str(name): AppObservation(
            name=str(name),
            status=serve_name(app.get("status")),
            message=serve_name(app.get("message"))[:500],
            replicas=_replicas(app, "replicas"),
            dead_replicas=_replicas(app, "recent_dead_replicas"),
        )
        for name, app in (details.get("applications") or {}).items()
    }


class RayServeBackend:
    """The reconciler's and router's access to Serve, from inside a gateway replica.

    ``head`` is the deployment every chat endpoint's app is built from
    (``deployments.dedicated_head.DedicatedHead``, a Serve Deployment whose type the
    decorator hides) and ``pooling_head`` the one of embedding and scoring endpoints
    (``deployments.embeddings.head.PoolingHead``, the catalog's own pooling head); the
    composition root passes them, so this module imports no head.
    """

    def __init__(self, head: Any, pooling_head: Any = None) -> None:
        self.heads: dict[str, Any] = {"chat": head}
        if pooling_head is not None:
            self.heads["pooling"] = pooling_head
        self._clients: dict[tuple[str, str], RayHeadClient] = {}

    def deploy(self, spec: AppSpec) -> None:
        """Submit one app and return at once (``serve.run`` would wait for its ingress to
        start, blocking the reconciler for a whole model boot)."""
        from ray import serve

        head = self.heads.get(spec.head)
        if head is None:
            raise RuntimeError(f"no dedicated head deployment for {spec.head!r} models")
        app = build_application(head, spec)
        target = serve.RunTarget(target=app, name=spec.name, route_prefix=None)
        serve.run_many(
            [target],
            wait_for_ingress_deployment_creation=False,
            wait_for_applications_running=False,
        )

    def delete(self, app_name: str) -> None:
        from ray import serve

        serve.delete(app_name, _blocking=False)

    def status(self) -> dict[str, AppObservation]:
        details = serve_details()
        if details is None:
            raise RuntimeError("Serve is not running")
        return observations(details)

    def head_client(self, app_name: str, deployment: str, model_id: str) -> HeadClient:
        return self._client(app_name, deployment, model_id)

    def pooling_client(self, app_name: str, deployment: str, model_id: str) -> PoolingClient:
        return self._client(app_name, deployment, model_id)

    def _client(self, app_name: str, deployment: str, model_id: str) -> RayHeadClient:
        """One ``RayHeadClient`` per deployment: it calls chat and pooling heads alike."""
        key = (app_name, deployment)
        client = self._clients.get(key)
        if client is None:
            from ray import serve

            handle = serve.get_deployment_handle(deployment, app_name=app_name)
            client = self._clients[key] = RayHeadClient(model_id, handle)
        return client

    async def sample(self, app_name: str, deployment: str, replicas: int) -> list[ReplicaStats]:
        """Counters of up to ``replicas`` distinct running replicas (routing picks them)."""
        from ray import serve

        handle = serve.get_deployment_handle(deployment, app_name=app_name)
        found: dict[str, ReplicaStats] = {}
        for _ in range(max(2, 3 * replicas)):
            try:
                stats = await asyncio.wait_for(handle.stats.remote(), SAMPLE_TIMEOUT_S)
            except Exception:
                logger.warning("sampling %s/%s failed", app_name, deployment, exc_info=True)
                break
            found[stats.replica_id] = stats
            if len(found) >= replicas:
                break
        return list(found.values())

    def deaths(self, replicas: Sequence[ReplicaObservation]) -> dict[str, ReplicaDeath]:
        """When Ray recorded each replica's end (``serve_app.dedicated.control.deaths``).

        One read of the dead nodes covers every replica; a replica whose node lives
        on is looked up in the actor table (one GCS read each, and only for replicas
        that just left Serve's list).
        """
        if not replicas:
            return {}
        lost = _dead_nodes()
        found: dict[str, ReplicaDeath] = {}
        for replica in replicas:
            death = lost.get(replica.node_id or "")
            if death is None and replica.actor_id:
                death = _actor_end(replica.actor_id)
            if death is not None:
                found[replica.replica_id] = death
        return found


def _dead_nodes() -> dict[str, ReplicaDeath]:
    """Node id -> its recorded end, for every node the GCS holds as dead."""
    import ray
    from ray.core.generated import common_pb2, gcs_pb2

    worker: Any = ray._private.worker.global_worker
    config: Any = ray._config  # the cluster's RayConfig, as this worker received it
    window = HealthCheckWindow(
        config.health_check_period_ms(), config.health_check_failure_threshold()
    )
    protos: Any = (common_pb2, gcs_pb2)  # generated modules: no stubs
    nodes = worker.gcs_client.get_all_node_info(
        timeout=GCS_TIMEOUT_S, state_filter=protos[1].GcsNodeInfo.DEAD
    )
    found: dict[str, ReplicaDeath] = {}
    for node_id, info in nodes.items():
        reason = protos[0].NodeDeathInfo.Reason.Name(info.death_info.reason)
        death = node_death(info.end_time_ms, reason, info.death_info.reason_message, window)
        if death is not None:
            found[node_id.hex()] = death
    return found


def _actor_end(actor_id: str) -> ReplicaDeath | None:
    """The actor table's record of one replica actor's end, if it is dead."""
    from ray._private import state

    actor: dict[str, Any] = state.state.actor_table(actor_id)
    if not actor:
        return None
    cause = actor.get("DeathCause")
    return actor_death(
        str(actor.get("State")),
        int(actor.get("EndTime") or 0),
        str(cause.WhichOneof("context")) if cause is not None else "",
    )
