"""Replica lifetimes from Serve's state: the billed minutes of dedicated endpoints.

docs/reference/dedicated.md: minutes accrue from the moment a replica holds its GPU, boot and
weight loading included, until it is released. Serve reports, per replica,
its ``start_time_s`` (when the controller asked Ray for the actor) and a
``node_id`` once the actor is allocated on a node. Between the two, the actor
is either starting its worker process on a node that already granted its
resources (seconds) or waiting for capacity that does not exist yet (an
autoscaler launching a node: minutes). So a life opens at the first
observation with a node and is dated:

- at ``start_time_s`` when the replica was never seen unplaced for longer than
  ``PLACEMENT_GRACE`` (process start-up: the resources were held);
- else at the last observation that still saw it unplaced (it was waiting for
  capacity, which bills nothing).

A life closes when the replica is gone from Serve's list, dated by Ray's own
record of its end where there is one (``serve_app.dedicated.control.deaths``), else
at that first observation (precision: one reconcile period, 2 s by default).
A node lost under a replica (a spot preemption without notice) is the case
that matters: Serve stops a replica it can no longer reach within seconds,
but the GCS declares its node dead only after its health checks ran out
(about 15 s), and dates that verdict. So a life closed without a record stays
open to correction for ``LOSS_WINDOW``: when the verdict comes, the life is
moved back to when the node died and marked ``lost`` (``node_lost``); the
seconds between the death and its detection are not billed. Replicas that
lived and died between two observations (a constructor that raises at once)
are taken from Serve's ``recent_dead_replicas`` so failed boots are billed and
shown too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from serve_app.dedicated.control.backend import AppObservation, AppSpec, ReplicaObservation
from serve_app.dedicated.control.deaths import ReplicaDeath
from serve_app.dedicated.store import DedicatedStore, EndpointRow, ReplicaEvent

logger = logging.getLogger(__name__)

DeathLookup = Callable[[Sequence[ReplicaObservation]], Mapping[str, ReplicaDeath]]

PLACEMENT_GRACE = timedelta(seconds=15)
LOSS_WINDOW = timedelta(seconds=90)
"""How long a life closed without Ray's record of the death waits for one. The GCS
declares a silent node dead ``failure_threshold`` health checks after its last sign of
life: 15 s with Ray's defaults, longer where each check waits out its timeout."""
_STATES = {
    "STARTING": "booting",
    "UPDATING": "running",
    "RECOVERING": "booting",
    "RUNNING": "running",
    "PENDING_MIGRATION": "running",
    "STOPPING": "draining",
}


@dataclass(frozen=True)
class _AwaitingVerdict:
    """A life closed at its first observation, until Ray may still date it earlier."""

    event: ReplicaEvent
    where: ReplicaObservation
    until: datetime


@dataclass(frozen=True)
class Watched:
    """An endpoint whose app the meter reads: its row and the app spec it should run."""

    row: EndpointRow
    spec: AppSpec | None


def _started(replica: ReplicaObservation, now: datetime) -> datetime:
    if replica.start_time_s is None:
        return now
    return min(now, datetime.fromtimestamp(replica.start_time_s, UTC))


class ReplicaMeter:
    """Opens, updates and closes ``dedicated_replicas`` rows from observations."""

    def __init__(self, store: DedicatedStore, deaths: DeathLookup | None = None) -> None:
        self.store = store
        self._deaths = deaths
        self._last_seen_at: datetime | None = None
        self._unplaced_since: dict[str, datetime] = {}
        self._placed: dict[str, ReplicaObservation] = {}
        """The last observation of each placed replica: where to ask about its death."""
        self._awaiting: dict[str, _AwaitingVerdict] = {}

    def record(
        self,
        observed: Mapping[str, AppObservation],
        watched: Mapping[str, Watched],
        now: datetime,
    ) -> None:
        """One reconcile's observations; ``watched`` maps app name -> endpoint."""
        open_events = self.store.open_events()
        seen: set[tuple[str, str]] = set()
        for app_name, obs in observed.items():
            entry = watched.get(app_name)
            if entry is None:
                continue
            for replica in (*obs.dead_replicas, *obs.replicas):
                if replica.node_id is not None:
                    self._placed[replica.replica_id] = replica
            for replica in obs.replicas:
                key = (entry.row.id, replica.replica_id)
                event = open_events.get(key) or self._open(entry, replica, now)
                if event is not None:
                    seen.add(key)
                    self._update(event, replica, now)
            self._short_lives(entry, obs, open_events, now)
        self._revise(now)
        gone = [event for key, event in open_events.items() if key not in seen]
        deaths = self._lookup([event.replica_id for event in gone])
        for event in gone:
            self._close(event, now, deaths.get(event.replica_id))
        live = {r.replica_id for obs in observed.values() for r in obs.replicas}
        self._unplaced_since = {k: v for k, v in self._unplaced_since.items() if k in live}
        self._placed = {k: v for k, v in self._placed.items() if k in live}
        self._last_seen_at = now

    def _lookup(self, replica_ids: Sequence[str]) -> Mapping[str, ReplicaDeath]:
        """Ray's record of when these replicas died; empty when it cannot say."""
        where = [self._placed[r] for r in replica_ids if r in self._placed]
        if not where or self._deaths is None:
            return {}
        try:
            return self._deaths(where)
        except Exception:
            logger.warning("could not read when replicas died; dating them now", exc_info=True)
            return {}

    def _revise(self, now: datetime) -> None:
        """Move lives closed without a record back to their node's death once Ray has it."""
        self._awaiting = {k: v for k, v in self._awaiting.items() if v.until > now}
        if not self._awaiting or self._deaths is None:
            return
        # Only node deaths can move a closed life back: the question leaves the actors out.
        where = [replace(a.where, actor_id=None) for a in self._awaiting.values()]
        try:
            deaths = self._deaths(where)
        except Exception:
            logger.warning("could not read when replicas died", exc_info=True)
            return
        for replica_id, death in deaths.items():
            waiting = self._awaiting.get(replica_id)
            closed_at = waiting.event.scaled_down_at if waiting else None
            if waiting is None or closed_at is None or not death.node_lost:
                continue
            del self._awaiting[replica_id]
            if death.at < closed_at:  # else the node died after the replica was released
                self._close(waiting.event, closed_at, death)

    def _open(
        self, entry: Watched, replica: ReplicaObservation, now: datetime
    ) -> ReplicaEvent | None:
        if replica.state not in _STATES or replica.state == "STOPPING":
            return None
        if replica.node_id is None:  # not allocated yet: see the module docstring
            self._unplaced_since.setdefault(replica.replica_id, now)
            return None
        start = _started(replica, now)
        waited_since = self._unplaced_since.pop(replica.replica_id, None)
        waited = waited_since is not None and now - min(start, waited_since) > PLACEMENT_GRACE
        if waited and self._last_seen_at is not None:
            start = max(start, self._last_seen_at)  # it was waiting for capacity
        event = self._event(entry, replica, start)
        self.store.add_event(event)
        logger.info("replica %s of %s placed", replica.replica_id, entry.row.alias)
        return event

    def _event(self, entry: Watched, replica: ReplicaObservation, start: datetime) -> ReplicaEvent:
        cls = entry.spec.capacity_class_of(replica.deployment) if entry.spec else None
        return ReplicaEvent(
            endpoint_id=entry.row.id,
            replica_id=replica.replica_id,
            deployment=replica.deployment,
            capacity_class=cls or ("reserved" if entry.row.mode == "reserved" else "spot"),
            gpu_type=entry.row.gpu_type,
            state="booting",
            version=entry.row.deploy_version,
            cards=entry.row.cards_per_replica,
            scaled_up_at=start,
        )

    def _short_lives(
        self,
        entry: Watched,
        obs: AppObservation,
        open_events: Mapping[tuple[str, str], ReplicaEvent],
        now: datetime,
    ) -> None:
        """Allocated replicas that died between two observations: billed and shown as failed."""
        recent = now - PLACEMENT_GRACE * 4
        candidates = [
            r
            for r in obs.dead_replicas
            if r.node_id is not None
            and (entry.row.id, r.replica_id) not in open_events
            and _started(r, now) >= recent
        ]
        if not candidates:
            return
        known = self.store.known_replicas(entry.row.id, [r.replica_id for r in candidates])
        new = [r for r in candidates if r.replica_id not in known]
        deaths = self._lookup([r.replica_id for r in new])
        for replica in new:
            event = self._event(entry, replica, _started(replica, now))
            self.store.add_event(event)
            self._close(event, now, deaths.get(replica.replica_id))

    def _update(self, event: ReplicaEvent, replica: ReplicaObservation, now: datetime) -> None:
        values: dict[str, object] = {}
        state = _STATES.get(replica.state, event.state)
        if state != event.state:
            values["state"] = state
        if replica.state == "RUNNING" and event.ready_at is None:
            values["ready_at"] = now
        if replica.state == "STOPPING" and event.drain_requested_at is None:
            values["drain_requested_at"] = now
        if values:
            self.store.update_event(event, **values)

    def _close(self, event: ReplicaEvent, now: datetime, death: ReplicaDeath | None) -> None:
        """End the life at Ray's recorded death, else now (see the module docstring);
        never later than ``now``, never before the life began."""
        end = now if death is None else min(now, max(event.scaled_up_at, death.at))
        values: dict[str, object] = {"scaled_down_at": end}
        if event.ready_at is not None and event.ready_at > end:
            values["ready_at"] = end  # it died before this meter saw it running
        if death is not None and death.node_lost:
            if event.drain_requested_at is not None and event.drain_requested_at > end:
                values["drain_requested_at"] = None  # Serve stopped a replica already gone
            self.store.update_event(event, state="lost", error_code="node_lost", **values)
            logger.warning(
                "replica %s lost with its node at %s (%s)",
                event.replica_id,
                end.isoformat(),
                death.reason,
            )
            return
        # Never ready and never asked to drain: it died while starting.
        failed = event.ready_at is None and event.drain_requested_at is None
        closed = self.store.update_event(
            event,
            state="failed" if failed else "released",
            error_code="boot_failed" if failed else None,
            **values,
        )
        logger.info("replica %s released", event.replica_id)
        where = self._placed.get(event.replica_id)
        if where is not None and self._deaths is not None:  # its node may yet be declared dead
            self._awaiting[event.replica_id] = _AwaitingVerdict(closed, where, now + LOSS_WINDOW)
