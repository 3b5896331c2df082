"""Billed replica lifetimes from Serve observations (placement, waits, short lives)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from serve_app.dedicated.control.backend import AppObservation, ReplicaObservation
from serve_app.dedicated.pricing.meter import ReplicaMeter, Watched
from serve_app.dedicated.store import DedicatedStore
from tests.unit.dedicated.conftest import DedicatedHarness, create_body

T0 = datetime(2031, 5, 10, 12, 0, tzinfo=UTC)


def _obs(
    *replicas: ReplicaObservation, dead: tuple[ReplicaObservation, ...] = ()
) -> AppObservation:
    return AppObservation("ded-my-bot", "RUNNING", replicas=replicas, dead_replicas=dead)


def _replica(rid: str, state: str, node: str | None, started: datetime) -> ReplicaObservation:
    return ReplicaObservation(rid, "head", state, node, started.timestamp())


async def _watched(ded: DedicatedHarness) -> tuple[DedicatedStore, dict[str, Watched]]:
    async with ded.client() as c:
        eid = (await c.post("/api/dedicated", json=create_body())).json()["endpoint_id"]
    store = ded.dedicated.store
    row = store.get(eid)
    assert row is not None
    return store, {"ded-my-bot": Watched(row, None)}


async def test_process_start_is_billed_but_waiting_for_capacity_is_not(
    ded: DedicatedHarness,
) -> None:
    store, watched = await _watched(ded)
    meter = ReplicaMeter(store)
    # r1: starting its worker (no node yet) for 4 s, then placed: billed from its start.
    meter.record({"ded-my-bot": _obs(_replica("r1", "STARTING", None, T0))}, watched, T0)
    placed = T0 + timedelta(seconds=4)
    meter.record({"ded-my-bot": _obs(_replica("r1", "STARTING", "n", T0))}, watched, placed)
    # r2: pending for 5 minutes (a node being launched), then placed.
    wait = [T0 + timedelta(seconds=s) for s in (6, 300, 302)]
    for at, node in zip(wait, (None, None, "n"), strict=True):
        meter.record(
            {
                "ded-my-bot": _obs(
                    _replica("r1", "RUNNING", "n", T0), _replica("r2", "STARTING", node, wait[0])
                )
            },
            watched,
            at,
        )
    events = {e.replica_id: e for e in store.open_events().values()}
    assert events["r1"].scaled_up_at == T0 and events["r1"].ready_at == wait[0]
    assert events["r2"].scaled_up_at == wait[1]  # the last time it was still waiting
    meter.record({"ded-my-bot": _obs()}, watched, T0 + timedelta(seconds=400))
    assert store.open_events() == {}


async def test_replica_that_died_between_reads_is_a_failed_boot(ded: DedicatedHarness) -> None:
    store, watched = await _watched(ded)
    meter = ReplicaMeter(store)
    dead = _replica("r9", "STOPPED", "n", T0)
    now = T0 + timedelta(seconds=2)
    for _ in range(2):  # Serve keeps listing it; it is recorded once
        meter.record({"ded-my-bot": _obs(dead=(dead,))}, watched, now)
    history, _ = store.history(watched["ded-my-bot"].row.id, 10)
    assert [(e.replica_id, e.state, e.error_code) for e in history] == [
        ("r9", "failed", "boot_failed")
    ]
    assert history[0].scaled_down_at == now


def test_serve_details_become_observations() -> None:
    from ray.serve._private.common import ReplicaState
    from ray.serve.schema import ApplicationStatus

    from serve_app.dedicated.control.ray_backend import observations

    details = {
        "applications": {
            "ded-x": {
                "status": ApplicationStatus.DEPLOYING,
                "message": "",
                "deployments": {
                    "head": {
                        "replicas": [
                            {
                                "replica_id": "a",
                                "state": ReplicaState.RUNNING,
                                "node_id": "n",
                                "actor_id": "act-a",
                                "start_time_s": 1.0,
                            },
                            {
                                "replica_id": "b",
                                "state": ReplicaState.STARTING,
                                "start_time_s": 2.0,
                            },
                        ],
                        "recent_dead_replicas": [
                            {
                                "replica_id": "c",
                                "state": ReplicaState.STOPPED,
                                "node_id": "n",
                                "start_time_s": 0.5,
                            }
                        ],
                    }
                },
            },
            "gateway": {"status": "RUNNING", "deployments": {}},
        }
    }
    obs = observations(details)
    assert set(obs) == {"ded-x", "gateway"}
    app = obs["ded-x"]
    assert (app.ready, app.total, app.running, app.failed) == (1, 2, False, False)
    assert app.replicas[1].node_id is None and app.dead_replicas[0].replica_id == "c"
    assert app.replicas[0].actor_id == "act-a"  # where the GCS records its death
    assert obs["gateway"].running
