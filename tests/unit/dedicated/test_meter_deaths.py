"""Replica lives end when Ray recorded the death, not when the meter first saw it gone."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest

from serve_app.dedicated.control.backend import AppObservation, ReplicaObservation
from serve_app.dedicated.control.deaths import (
    HealthCheckWindow,
    ReplicaDeath,
    actor_death,
    node_death,
)
from serve_app.dedicated.pricing.meter import LOSS_WINDOW, ReplicaMeter
from tests.unit.dedicated.conftest import DedicatedHarness
from tests.unit.dedicated.test_meter import T0, _watched

RAY_DEFAULTS = HealthCheckWindow(period_ms=3000, failure_threshold=5)
SPOT = "node-spot"


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def _replica(rid: str, state: str, node: str | None = SPOT) -> ReplicaObservation:
    return ReplicaObservation(rid, "head", state, node, T0.timestamp(), actor_id=f"actor-{rid}")


def _obs(*replicas: ReplicaObservation, dead: Sequence[ReplicaObservation] = ()) -> AppObservation:
    return AppObservation("ded-my-bot", "RUNNING", replicas=replicas, dead_replicas=tuple(dead))


class RayRecords:
    """What the GCS would answer; records each question."""

    def __init__(self, deaths: dict[str, ReplicaDeath] | None = None) -> None:
        self.deaths = deaths or {}
        self.asked: list[list[ReplicaObservation]] = []
        self.fail = False

    def __call__(self, replicas: Sequence[ReplicaObservation]) -> dict[str, ReplicaDeath]:
        self.asked.append(list(replicas))
        if self.fail:
            raise ConnectionError("GCS unreachable")
        return {
            r.replica_id: self.deaths[r.replica_id] for r in replicas if r.replica_id in self.deaths
        }


# ---- the evidence ----------------------------------------------------------------------


def test_health_check_verdict_is_dated_at_the_last_evidence_of_life() -> None:
    verdict = _at(20)
    death = node_death(
        _ms(verdict),
        "UNEXPECTED_TERMINATION",
        "health check failed due to missing too many heartbeats",
        RAY_DEFAULTS,
    )
    assert death is not None and death.node_lost
    # Silence for a period, then five failed checks 3 s apart: alive 15 s before the verdict.
    assert death.at == verdict - timedelta(seconds=15)
    assert "UNEXPECTED_TERMINATION" in death.reason


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("EXPECTED_TERMINATION", "received SIGTERM"),
        ("AUTOSCALER_DRAIN_PREEMPTED", "preempted by the cloud provider"),
        ("UNEXPECTED_TERMINATION", "raylet exited with code 1"),
    ],
)
def test_a_node_that_reported_its_own_end_ended_at_its_end_time(reason: str, message: str) -> None:
    death = node_death(_ms(_at(20)), reason, message, RAY_DEFAULTS)
    assert death is not None and death.at == _at(20) and death.node_lost


def test_no_recorded_end_is_no_evidence() -> None:
    assert node_death(0, "UNSPECIFIED", "", RAY_DEFAULTS) is None
    assert actor_death("ALIVE", _ms(_at(5))) is None
    assert actor_death("DEAD", 0) is None
    dead = actor_death("DEAD", _ms(_at(5)), "actor_died_error_context")
    assert dead is not None and dead.at == _at(5) and not dead.node_lost


# ---- the meter --------------------------------------------------------------------------


async def _running(ded: DedicatedHarness, records: RayRecords) -> tuple[ReplicaMeter, dict]:
    store, watched = await _watched(ded)
    meter = ReplicaMeter(store, deaths=records)
    for second in (0, 2):
        meter.record({"ded-my-bot": _obs(_replica("r1", "RUNNING"))}, watched, _at(second))
    return meter, watched


async def test_preempted_replica_is_billed_until_its_node_died(ded: DedicatedHarness) -> None:
    died = _at(5)
    records = RayRecords({"r1": ReplicaDeath(died, node_lost=True, reason="health check failed")})
    meter, watched = await _running(ded, records)
    store = meter.store
    # Serve still lists it until the GCS declares the node dead, then stops it.
    meter.record({"ded-my-bot": _obs(_replica("r1", "RUNNING"))}, watched, _at(10))
    meter.record({"ded-my-bot": _obs(_replica("r1", "STOPPING"))}, watched, _at(21))
    pending = _replica("r2", "STARTING", node=None)  # its replacement waits for capacity
    meter.record({"ded-my-bot": _obs(pending)}, watched, _at(23))

    (life,), _ = store.history(watched["ded-my-bot"].row.id, 10)
    assert life.replica_id == "r1" and life.scaled_down_at == died  # not 23 s, when seen gone
    assert (life.state, life.error_code) == ("lost", "node_lost")
    assert life.drain_requested_at is None  # the stop came after it was gone: no drain
    # The question named where the replica ran, from the last observation of it.
    assert [(r.replica_id, r.node_id, r.actor_id) for r in records.asked[-1]] == [
        ("r1", SPOT, "actor-r1")
    ]
    assert store.open_events() == {}  # the pending replacement bills nothing yet


async def test_life_closed_before_the_verdict_is_moved_back_to_the_death(
    ded: DedicatedHarness,
) -> None:
    records = RayRecords()
    meter, watched = await _running(ded, records)
    eid = watched["ded-my-bot"].row.id
    # Serve cannot reach the replica and stops it within seconds; the GCS has no verdict yet.
    meter.record({"ded-my-bot": _obs(_replica("r1", "STOPPING"))}, watched, _at(5))
    meter.record({"ded-my-bot": _obs()}, watched, _at(7))
    (life,), _ = meter.store.history(eid, 10)
    assert (life.scaled_down_at, life.state) == (_at(7), "released")
    meter.record({"ded-my-bot": _obs()}, watched, _at(9))
    # The verdict: the node was last known alive at 3 s.
    records.deaths["r1"] = ReplicaDeath(_at(3), node_lost=True, reason="health check failed")
    meter.record({"ded-my-bot": _obs()}, watched, _at(20))
    (life,), _ = meter.store.history(eid, 10)
    assert (life.scaled_down_at, life.state, life.error_code) == (_at(3), "lost", "node_lost")
    assert life.drain_requested_at is None
    # Waiting for a verdict asks about the node only (one read), and stops once it came.
    assert [r.actor_id for r in records.asked[-1]] == [None]
    asked = len(records.asked)
    meter.record({"ded-my-bot": _obs()}, watched, _at(22))
    assert len(records.asked) == asked


async def test_no_verdict_within_the_window_leaves_the_life_as_closed(
    ded: DedicatedHarness,
) -> None:
    records = RayRecords()
    meter, watched = await _running(ded, records)
    eid = watched["ded-my-bot"].row.id
    meter.record({"ded-my-bot": _obs()}, watched, _at(7))
    late = _at(7) + LOSS_WINDOW + timedelta(seconds=1)
    records.deaths["r1"] = ReplicaDeath(_at(3), node_lost=True, reason="x")
    asked = len(records.asked)
    meter.record({"ded-my-bot": _obs()}, watched, late)
    assert len(records.asked) == asked  # no longer asked
    (life,), _ = meter.store.history(eid, 10)
    assert (life.scaled_down_at, life.state) == (_at(7), "released")


async def test_a_node_that_died_after_the_release_changes_nothing(ded: DedicatedHarness) -> None:
    records = RayRecords()
    meter, watched = await _running(ded, records)
    eid = watched["ded-my-bot"].row.id
    meter.record({"ded-my-bot": _obs()}, watched, _at(7))  # scaled down, node lives on
    records.deaths["r1"] = ReplicaDeath(_at(30), node_lost=True, reason="x")
    meter.record({"ded-my-bot": _obs()}, watched, _at(40))
    (life,), _ = meter.store.history(eid, 10)
    assert (life.scaled_down_at, life.state) == (_at(7), "released")


async def test_without_evidence_the_life_ends_when_seen_gone(ded: DedicatedHarness) -> None:
    records = RayRecords()
    meter, watched = await _running(ded, records)
    records.fail = True
    meter.record({"ded-my-bot": _obs()}, watched, _at(30))
    (life,), _ = meter.store.history(watched["ded-my-bot"].row.id, 10)
    assert life.scaled_down_at == _at(30) and life.state == "released"


async def test_recorded_death_never_moves_a_life_outside_what_was_observed(
    ded: DedicatedHarness,
) -> None:
    # A clock skewed between the GCS host and this one: a death "before" the life began
    # ends it where it began; one "after" now ends it now.
    early = RayRecords({"r1": ReplicaDeath(_at(-60), node_lost=True, reason="x")})
    meter, watched = await _running(ded, early)
    meter.record({"ded-my-bot": _obs()}, watched, _at(30))
    (life,), _ = meter.store.history(watched["ded-my-bot"].row.id, 10)
    assert life.scaled_down_at == life.scaled_up_at == T0

    late = RayRecords({"r2": ReplicaDeath(_at(90), node_lost=False, reason="x")})
    meter = ReplicaMeter(meter.store, deaths=late)
    meter.record({"ded-my-bot": _obs(_replica("r2", "RUNNING"))}, watched, _at(40))
    meter.record({"ded-my-bot": _obs()}, watched, _at(42))
    ended = {e.replica_id: e for e in meter.store.history(watched["ded-my-bot"].row.id, 10)[0]}
    assert ended["r2"].scaled_down_at == _at(42) and ended["r2"].state == "released"


async def test_scale_down_is_dated_by_the_actor_table(ded: DedicatedHarness) -> None:
    stopped = _at(3)
    records = RayRecords({"r1": ReplicaDeath(stopped, node_lost=False, reason="ray_kill")})
    meter, watched = await _running(ded, records)
    meter.record({"ded-my-bot": _obs(_replica("r1", "STOPPING"))}, watched, _at(2.5))
    meter.record({"ded-my-bot": _obs()}, watched, _at(6))
    (life,), _ = meter.store.history(watched["ded-my-bot"].row.id, 10)
    assert (life.scaled_down_at, life.state, life.error_code) == (stopped, "released", None)


async def test_short_life_on_a_lost_node_is_dated_by_the_node(ded: DedicatedHarness) -> None:
    store, watched = await _watched(ded)
    died = _at(1)
    records = RayRecords({"r9": ReplicaDeath(died, node_lost=True, reason="x")})
    meter = ReplicaMeter(store, deaths=records)
    dead = ReplicaObservation("r9", "head", "STOPPED", SPOT, T0.timestamp(), actor_id="a9")
    meter.record({"ded-my-bot": _obs(dead=(dead,))}, watched, _at(4))
    (life,), _ = store.history(watched["ded-my-bot"].row.id, 10)
    assert (life.scaled_down_at, life.state) == (died, "lost")
