"""SQL access for dedicated endpoints (SQLite and PostgreSQL, SQLAlchemy Core).

The store is the only code that writes the dedicated tables. Two rules keep
concurrent writers honest: creation checks the org quota and alias uniqueness
inside the insert's transaction (the alias column is unique, so two racing
creates cannot both win), and the reconciler's state transitions are
conditional on ``revision`` (``transition``), so a reconcile based on an old
read never undoes an API change made meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from serve_app.dedicated.options import RateCardOptions
from serve_app.protocol.dedicated import DedicatedEngineConfig, DedicatedScalingPolicy, Mode
from serve_app.protocol.errors import ConflictError, PermissionDeniedError
from serve_app.storage.db import Database
from serve_app.storage.schema import (
    dedicated_endpoints as endpoints,
)
from serve_app.storage.schema import (
    dedicated_leases as leases,
)
from serve_app.storage.schema import (
    dedicated_rate_cards as rate_cards,
)
from serve_app.storage.schema import (
    dedicated_replicas as replicas,
)
from serve_app.storage.schema import (
    dedicated_requests as requests_table,
)

_JSON_COLUMNS = ("scaling", "engine", "previous", "live")


@dataclass(frozen=True)
class EndpointRow:
    """One stored endpoint (the lifecycle of docs/reference/dedicated.md#lifecycle, not the
    presented status)."""

    id: str
    org_id: str
    created_by: str
    model_id: str
    slug: str
    alias: str
    mode: Mode
    lifecycle: str  # provisioning | active | paused | error | deleted
    gpu_type: str
    min_replicas: int
    max_replicas: int
    reserved_floor: int
    cards_per_replica: int
    revision: int
    deploy_version: int
    rolled_back: bool
    pending: str | None
    scaling: DedicatedScalingPolicy | None
    engine: DedicatedEngineConfig | None
    previous: dict[str, Any] | None
    previous_mode: Mode | None
    deployed_hash: str | None
    live: dict[str, Any] | None
    last_error: str | None
    block_tokens: int | None
    created_at: datetime
    pending_since: datetime | None = None
    mode_changed_at: datetime | None = None
    engine_changed_at: datetime | None = None
    deleted_at: datetime | None = None
    deployed_at: datetime | None = None
    observed_at: datetime | None = None


def _utc(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _from_row(row: sa.RowMapping) -> EndpointRow:
    data = {f.name: _utc(row[f.name]) for f in fields(EndpointRow)}
    for name in _JSON_COLUMNS:
        data[name] = json.loads(data[name]) if data[name] else None
    if data["scaling"] is not None:
        data["scaling"] = DedicatedScalingPolicy(**data["scaling"])
    if data["engine"] is not None:
        data["engine"] = DedicatedEngineConfig(**data["engine"])
    return EndpointRow(**data)


def _to_values(values: dict[str, Any]) -> dict[str, Any]:
    """Column values from row fields (pydantic and dicts become JSON text)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in _JSON_COLUMNS and value is not None:
            value = value.model_dump() if hasattr(value, "model_dump") else value
            value = json.dumps(value, sort_keys=True)
        out[key] = value
    return out


@dataclass(frozen=True)
class ReplicaEvent:
    """One replica's life (a row of ``dedicated_replicas``)."""

    endpoint_id: str
    replica_id: str
    deployment: str
    capacity_class: str
    gpu_type: str
    state: str
    version: int
    cards: int
    scaled_up_at: datetime
    ready_at: datetime | None = None
    drain_requested_at: datetime | None = None
    scaled_down_at: datetime | None = None
    error_code: str | None = None


def _event(row: sa.RowMapping) -> ReplicaEvent:
    return ReplicaEvent(**{f.name: _utc(row[f.name]) for f in fields(ReplicaEvent)})


class DedicatedStore:
    """Reads and writes the dedicated tables."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ---- endpoints --------------------------------------------------------
    def create(self, row: EndpointRow, quota: int) -> EndpointRow:
        """Insert ``row`` unless the org is at ``quota`` (403) or the alias exists (409)."""
        try:
            with self.db.begin() as conn:
                if self.db.dialect == "postgresql":  # serialise creates of one org
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_org_lock(row.org_id))))
                count = conn.execute(
                    sa.select(sa.func.count())
                    .select_from(endpoints)
                    .where(endpoints.c.org_id == row.org_id, endpoints.c.lifecycle != "deleted")
                ).scalar_one()
                if count >= quota:
                    raise PermissionDeniedError(
                        f"Your organization already has {count} dedicated endpoints "
                        f"(quota {quota}); delete one first.",
                        code="dedicated_quota_exceeded",
                    )
                taken = conn.execute(
                    sa.select(endpoints.c.id).where(endpoints.c.alias == row.alias)
                ).first()
                if taken is not None:
                    raise _alias_taken(row.alias)
                conn.execute(sa.insert(endpoints).values(**_to_values(row.__dict__)))
        except IntegrityError:
            raise _alias_taken(row.alias) from None
        return row

    def get(self, endpoint_id: str) -> EndpointRow | None:
        return self._one(endpoints.c.id == endpoint_id)

    def by_alias(self, alias: str) -> EndpointRow | None:
        return self._one(endpoints.c.alias == alias)

    def _one(self, where: Any) -> EndpointRow | None:
        with self.db.connect() as conn:
            row = conn.execute(sa.select(endpoints).where(where)).mappings().first()
        return None if row is None else _from_row(row)

    def list_org(self, org_id: str) -> list[EndpointRow]:
        """The org's endpoints that are not deleted, oldest first."""
        query = (
            sa.select(endpoints)
            .where(endpoints.c.org_id == org_id, endpoints.c.lifecycle != "deleted")
            .order_by(endpoints.c.created_at, endpoints.c.id)
        )
        with self.db.connect() as conn:
            return [_from_row(r) for r in conn.execute(query).mappings()]

    def list_live(self) -> list[EndpointRow]:
        """Every endpoint the reconciler must look at (deleted ones still deployed too)."""
        query = sa.select(endpoints).where(
            sa.or_(endpoints.c.lifecycle != "deleted", endpoints.c.deployed_hash.is_not(None))
        )
        with self.db.connect() as conn:
            return [_from_row(r) for r in conn.execute(query).mappings()]

    def update(self, row: EndpointRow, **values: Any) -> EndpointRow:
        """An API change: applied unconditionally, ``revision`` + 1."""
        values["revision"] = endpoints.c.revision + 1
        with self.db.begin() as conn:
            conn.execute(
                sa.update(endpoints).where(endpoints.c.id == row.id).values(**_to_values(values))
            )
        fresh = self.get(row.id)
        assert fresh is not None
        return fresh

    def transition(self, row: EndpointRow, **values: Any) -> bool:
        """A reconciler change: applied only if no API change happened since ``row`` was read."""
        stmt = (
            sa.update(endpoints)
            .where(endpoints.c.id == row.id, endpoints.c.revision == row.revision)
            .values(**_to_values(values))
        )
        with self.db.begin() as conn:
            return bool(conn.execute(stmt).rowcount)

    def observe(self, endpoint_id: str, **values: Any) -> None:
        """Facts about Serve (live counts, what is deployed): written whatever the revision."""
        with self.db.begin() as conn:
            conn.execute(
                sa.update(endpoints)
                .where(endpoints.c.id == endpoint_id)
                .values(**_to_values(values))
            )

    # ---- replica lifetimes --------------------------------------------------
    def open_events(self) -> dict[tuple[str, str], ReplicaEvent]:
        query = sa.select(replicas).where(replicas.c.scaled_down_at.is_(None))
        with self.db.connect() as conn:
            events = [_event(r) for r in conn.execute(query).mappings()]
        return {(e.endpoint_id, e.replica_id): e for e in events}

    # ---- rate cards ------------------------------------------------------------
    def rate_card_history(
        self, current: RateCardOptions, now: datetime
    ) -> list[tuple[datetime, RateCardOptions]]:
        """Every card with the time it took effect, oldest first; ``current`` is recorded
        (effective ``now``) when it differs from the latest one, so a changed config
        prices only the minutes that accrue from then on."""
        query = sa.select(rate_cards.c.effective_from, rate_cards.c.card).order_by(
            rate_cards.c.effective_from, rate_cards.c.id
        )
        with self.db.connect() as conn:
            rows = conn.execute(query).all()
        history = [(_utc(r[0]), RateCardOptions.model_validate_json(r[1])) for r in rows]
        if not history or history[-1][1] != current:
            with self.db.begin() as conn:
                conn.execute(
                    sa.insert(rate_cards).values(effective_from=now, card=current.model_dump_json())
                )
            history.append((now, current))
        return history

    def add_event(self, event: ReplicaEvent) -> None:
        with self.db.begin() as conn:
            conn.execute(sa.insert(replicas).values(**event.__dict__))

    def known_replicas(self, endpoint_id: str, replica_ids: Sequence[str]) -> set[str]:
        """Which of ``replica_ids`` already have a life recorded (open or closed)."""
        query = sa.select(replicas.c.replica_id).where(
            replicas.c.endpoint_id == endpoint_id, replicas.c.replica_id.in_(list(replica_ids))
        )
        with self.db.connect() as conn:
            return {str(r) for r in conn.execute(query).scalars()}

    def update_event(self, event: ReplicaEvent, **values: Any) -> ReplicaEvent:
        with self.db.begin() as conn:
            conn.execute(
                sa.update(replicas)
                .where(
                    replicas.c.endpoint_id == event.endpoint_id,
                    replicas.c.replica_id == event.replica_id,
                )
                .values(**values)
            )
        return replace(event, **values)

    def events_since(self, endpoint_ids: Sequence[str], since: datetime) -> list[ReplicaEvent]:
        """Lives that overlap [since, now]: still open, or closed after ``since``."""
        if not endpoint_ids:
            return []
        query = sa.select(replicas).where(
            replicas.c.endpoint_id.in_(list(endpoint_ids)),
            sa.or_(replicas.c.scaled_down_at.is_(None), replicas.c.scaled_down_at >= since),
        )
        with self.db.connect() as conn:
            return [_event(r) for r in conn.execute(query).mappings()]

    def history(self, endpoint_id: str, limit: int) -> tuple[list[ReplicaEvent], bool]:
        """Newest first; ``truncated`` when more than ``limit`` exist."""
        query = (
            sa.select(replicas)
            .where(replicas.c.endpoint_id == endpoint_id)
            .order_by(replicas.c.scaled_up_at.desc(), replicas.c.replica_id)
            .limit(limit + 1)
        )
        with self.db.connect() as conn:
            events = [_event(r) for r in conn.execute(query).mappings()]
        return events[:limit], len(events) > limit

    def org_endpoint_ids(self, org_id: str) -> list[str]:
        """Every endpoint of the org, deleted ones included (they billed this month too)."""
        query = sa.select(endpoints.c.id).where(endpoints.c.org_id == org_id)
        with self.db.connect() as conn:
            return [str(i) for i in conn.execute(query).scalars()]

    # ---- per-call telemetry ----------------------------------------------------
    def add_requests(self, rows: Iterable[dict[str, Any]]) -> None:
        batch = list(rows)
        if batch:
            with self.db.begin() as conn:
                conn.execute(sa.insert(requests_table), batch)

    def requests_since(self, endpoint_id: str, since: datetime) -> list[sa.RowMapping]:
        query = sa.select(requests_table).where(
            requests_table.c.endpoint_id == endpoint_id, requests_table.c.at >= since
        )
        with self.db.connect() as conn:
            return list(conn.execute(query).mappings())

    def calls_by_replica(self, endpoint_id: str) -> dict[str, int]:
        query = (
            sa.select(requests_table.c.replica_id, sa.func.count())
            .where(
                requests_table.c.endpoint_id == endpoint_id,
                requests_table.c.replica_id.is_not(None),
            )
            .group_by(requests_table.c.replica_id)
        )
        with self.db.connect() as conn:
            return {str(r[0]): int(r[1]) for r in conn.execute(query)}

    # ---- reconciler lease -------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: datetime) -> bool:
        """Take or renew the lease; True when ``holder`` holds it until now + ttl."""
        expires = now + timedelta(seconds=ttl_s)
        take = (
            sa.update(leases)
            .where(
                leases.c.name == name,
                sa.or_(leases.c.holder == holder, leases.c.expires_at < now),
            )
            .values(holder=holder, expires_at=expires)
        )
        with self.db.begin() as conn:
            if conn.execute(take).rowcount:
                return True
            exists = conn.execute(sa.select(leases.c.name).where(leases.c.name == name)).first()
            if exists is not None:
                return False
        try:
            with self.db.begin() as conn:
                conn.execute(sa.insert(leases).values(name=name, holder=holder, expires_at=expires))
            return True
        except IntegrityError:
            return False

    def release_lease(self, name: str, holder: str) -> None:
        with self.db.begin() as conn:
            conn.execute(sa.delete(leases).where(leases.c.name == name, leases.c.holder == holder))


def _alias_taken(alias: str) -> ConflictError:
    return ConflictError(
        f"The alias '{alias}' is taken (aliases are never reused).", code="alias_taken"
    )


def _org_lock(org_id: str) -> int:
    """A stable 63-bit advisory lock key per organization."""
    import hashlib

    return int.from_bytes(hashlib.sha256(f"ded:{org_id}".encode()).digest()[:8], "big") >> 1
