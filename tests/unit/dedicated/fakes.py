"""A ``ServeBackend`` that behaves like Ray Serve's per-app API, without Ray.

It keeps what Serve keeps (apps, deployments, replicas with ids and states) and
applies Serve's update rules: a new code ``version`` or new ``ray_actor_options``
replaces the replicas, anything else (autoscaling, queue bound) keeps them. Time
does not pass by itself: ``boot()`` finishes every pending start, and an engine
config listed in ``fail_on`` makes starts fail (the app goes DEPLOY_FAILED, as
Serve does after its constructor retries). Calls run the real ``ChatHeadCore``
around ``ScriptedEngine`` (a pooling endpoint's: the real ``PoolingHeadCore``
around ``ScriptedPoolingEngine``), and a call to a deployment at zero replicas
boots one.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from deployments.chat.head import ChatHeadCore
from deployments.embeddings.head import PoolingHeadCore
from serve_app.contract.chat import HeadEvent, HeadRequest
from serve_app.contract.dedicated import ReplicaStats, ServedBy
from serve_app.contract.embeddings import (
    EmbedHeadReply,
    EmbedHeadRequest,
    ScoreHeadReply,
    ScoreHeadRequest,
)
from serve_app.dedicated.control.backend import AppObservation, AppSpec, ReplicaObservation
from serve_app.dedicated.control.deaths import ReplicaDeath
from tests.fakes.scripted_engine import ScriptedEngine
from tests.fakes.scripted_pooling import ScriptedPoolingEngine

_ids = itertools.count(1)


@dataclass
class FakeReplica:
    replica_id: str
    deployment: str
    state: str = "STARTING"
    tokens: int = 0
    calls: int = 0


@dataclass
class FakeApp:
    spec: AppSpec
    status: str = "DEPLOYING"
    message: str = ""
    replicas: list[FakeReplica] = field(default_factory=list)


def _target(options: dict[str, Any]) -> int:
    if "num_replicas" in options:
        return int(options["num_replicas"])
    return int(options["autoscaling_config"]["initial_replicas"])


def _restart_key(options: dict[str, Any]) -> Any:
    return (options.get("version"), repr(options.get("ray_actor_options")))


class FakeServeBackend:
    def __init__(self) -> None:
        self.apps: dict[str, FakeApp] = {}
        self.deployed: list[AppSpec] = []
        self.deleted: list[str] = []
        self.fail_on: list[dict[str, Any]] = []
        self.other_apps: dict[str, str] = {"gateway": "RUNNING"}
        self.cores: dict[str, ChatHeadCore] = {}
        self.pooling_cores: dict[str, PoolingHeadCore] = {}
        self.boot_delay_s = 0.0
        """How long a call that boots a replica from zero waits before the replica answers."""
        self.recorded_deaths: dict[str, ReplicaDeath] = {}
        """What Ray's tables would say about replicas that died (``deaths``)."""

    # ---- ServeBackend --------------------------------------------------------
    def deploy(self, spec: AppSpec) -> None:
        self.deployed.append(spec)
        app = self.apps.get(spec.name)
        old = {d.name: d.options for d in app.spec.deployments} if app else {}
        replicas = []
        for dep in spec.deployments:
            keep = [
                r
                for r in (app.replicas if app else [])
                if r.deployment == dep.name
                and dep.name in old
                and _restart_key(old[dep.name]) == _restart_key(dep.options)
            ]
            missing = max(0, _target(dep.options) - len(keep))
            replicas += keep
            replicas += [self._new_replica(dep.name) for _ in range(missing)]
        self.apps[spec.name] = FakeApp(spec=spec, replicas=replicas)

    def delete(self, app_name: str) -> None:
        self.deleted.append(app_name)
        self.apps.pop(app_name, None)

    def status(self) -> dict[str, AppObservation]:
        result = {
            name: AppObservation(name=name, status=status)
            for name, status in self.other_apps.items()
        }
        for name, app in self.apps.items():
            result[name] = AppObservation(
                name=name,
                status=app.status,
                message=app.message,
                replicas=tuple(
                    ReplicaObservation(r.replica_id, r.deployment, r.state, "node-1", None)
                    for r in app.replicas
                ),
            )
        return result

    def head_client(self, app_name: str, deployment: str, model_id: str) -> FakeHeadClient:
        return FakeHeadClient(self, app_name, deployment)

    def pooling_client(self, app_name: str, deployment: str, model_id: str) -> FakePoolingClient:
        return FakePoolingClient(self, app_name, deployment)

    async def sample(self, app_name: str, deployment: str, replicas: int) -> list[ReplicaStats]:
        app = self.apps[app_name]
        return [
            ReplicaStats(r.replica_id, 10.0, r.tokens, r.calls, 0, 0)
            for r in app.replicas
            if r.deployment == deployment and r.state == "RUNNING"
        ][:replicas]

    def deaths(self, replicas: Sequence[ReplicaObservation]) -> dict[str, ReplicaDeath]:
        return {
            r.replica_id: self.recorded_deaths[r.replica_id]
            for r in replicas
            if r.replica_id in self.recorded_deaths
        }

    # ---- test controls ---------------------------------------------------------
    def _new_replica(self, deployment: str) -> FakeReplica:
        return FakeReplica(replica_id=f"r{next(_ids)}", deployment=deployment)

    def boot(self) -> None:
        """Finish every pending start (or fail it, see ``fail_on``)."""
        for app in self.apps.values():
            if any(app.spec.engine_config.get(k) == v for f in self.fail_on for k, v in f.items()):
                app.replicas = []
                app.status, app.message = "DEPLOY_FAILED", "replica constructor raised"
                continue
            for replica in app.replicas:
                replica.state = "RUNNING"
            app.status = "RUNNING"

    def replica_ids(self, app_name: str) -> list[str]:
        return [r.replica_id for r in self.apps[app_name].replicas]


class FakeHeadClient:
    """Routes a call to a running replica of the fake app, booting one at zero."""

    def __init__(self, backend: FakeServeBackend, app_name: str, deployment: str) -> None:
        self.backend = backend
        self.app_name = app_name
        self.deployment = deployment

    async def replica(self) -> FakeReplica:
        """A replica of the deployment to serve the call (booted from zero if none)."""
        app = self.backend.apps[self.app_name]
        running = [r for r in app.replicas if r.deployment == self.deployment]
        if not running:  # scale from zero: the call makes Serve start one
            running = [self.backend._new_replica(self.deployment)]
            app.replicas.extend(running)
            await asyncio.sleep(self.backend.boot_delay_s)
        replica = running[0]
        replica.state = "RUNNING"
        replica.calls += 1
        return replica

    async def stream(self, request: HeadRequest) -> AsyncIterator[HeadEvent | ServedBy]:
        app = self.backend.apps[self.app_name]
        replica = await self.replica()
        core = self.backend.cores.get(self.app_name)
        if core is None:
            config = {"max_model_len": 4096, **app.spec.engine_config}
            core = self.backend.cores[self.app_name] = ChatHeadCore(ScriptedEngine(config))
            await core.start()
        yield ServedBy(replica.replica_id)
        async for event in core.generate(request):
            yield event


class FakePoolingClient(FakeHeadClient):
    """A pooling endpoint's deployment: the real ``PoolingHeadCore`` around the scripted
    pooling engine, started with the app's engine config (384-dimension vectors)."""

    async def embed(self, request: EmbedHeadRequest) -> EmbedHeadReply:
        replica, core = await self._core()
        reply = await core.embed(request)
        replica.tokens += getattr(reply, "prompt_tokens", 0)  # as ``PoolingHead`` counts
        return reply

    async def score(self, request: ScoreHeadRequest) -> ScoreHeadReply:
        replica, core = await self._core()
        reply = await core.score(request)
        replica.tokens += getattr(reply, "prompt_tokens", 0)
        return reply

    async def _core(self) -> tuple[FakeReplica, PoolingHeadCore]:
        replica = await self.replica()
        core = self.backend.pooling_cores.get(self.app_name)
        if core is None:
            config = {"dimensions": 384, **self.backend.apps[self.app_name].spec.engine_config}
            engine = ScriptedPoolingEngine(config)
            core = self.backend.pooling_cores[self.app_name] = PoolingHeadCore(engine)
            await core.start()
        return replica, core
