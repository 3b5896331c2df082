"""From stored rows and observations to what callers see: status, records, call admission.

The stored lifecycle (provisioning, active, paused, error, deleted) changes
only on API calls and on reconciler transitions; ``warming`` and ``updating``
are derived here from the pending change and the replica counts the reconciler
last observed in Serve (docs/reference/dedicated.md#lifecycle: "derived for presentation").
"""

from __future__ import annotations

from collections.abc import Iterable

from serve_app.dedicated.offer.catalog import Offering, Offerings
from serve_app.dedicated.offer.engine import unknown_model_bounds
from serve_app.dedicated.offer.scaling import BURST, HEAD, scaling_bounds, scaling_state
from serve_app.dedicated.options import DedicatedModelOptions
from serve_app.dedicated.pricing.rates import MonthUsage, ReplicaSpan
from serve_app.dedicated.store import EndpointRow, ReplicaEvent
from serve_app.protocol.dedicated import (
    DedicatedEndpoint,
    LiveReplicas,
    MonthMinutes,
    Status,
)
from serve_app.protocol.errors import ModelUnavailableError, model_not_found, model_warming

REDEPLOYS = frozenset({"mode", "engine", "rollback"})


def live_counts(row: EndpointRow) -> tuple[int, int] | None:
    """(ready, total) as last observed, or None while nothing is deployed."""
    if row.live is None or "ready" not in row.live:
        return None
    return int(row.live.get("ready", 0)), int(row.live.get("total", 0))


def presented_status(row: EndpointRow) -> Status:
    if row.lifecycle in ("deleted", "paused", "error"):
        return row.lifecycle  # type: ignore[return-value]
    live = live_counts(row)
    if row.lifecycle == "provisioning":
        return "provisioning" if live is None else "warming"
    if row.pending in REDEPLOYS:
        return "updating"
    if live is None:
        return "warming" if row.pending == "resume" else "active"
    ready, total = live
    if ready == 0 and (total > 0 or row.pending == "resume"):
        return "warming"
    return "active"


def admit_call(row: EndpointRow, retry_after_s: int) -> bool:
    """Whether a call may go to the endpoint now; True when it wakes one at rest.

    At rest (``min_replicas`` 0, nothing pending) a call is let through: Serve
    queues it and boots a replica (spec: "first call boots a replica"), and
    calls arriving during that boot queue behind it. Any other endpoint with
    no ready replica answers 503 ``model_warming`` with ``Retry-After``.
    """
    if row.lifecycle == "deleted":
        raise model_not_found(row.alias)
    if row.lifecycle == "paused":
        raise ModelUnavailableError(
            f"The dedicated endpoint '{row.alias}' is paused; resume it to call it.",
            code="model_unavailable",
        )
    if row.lifecycle == "error":
        raise ModelUnavailableError(
            f"The dedicated endpoint '{row.alias}' failed to deploy.", code="model_unavailable"
        )
    live = live_counts(row)
    if live is not None and live[0] > 0:
        return False
    at_rest = row.lifecycle == "active" and row.pending is None and row.min_replicas == 0
    if at_rest and live is not None and row.mode != "hybrid":
        return True
    raise model_warming(row.alias, retry_after_s)


def spans(events: Iterable[ReplicaEvent]) -> list[ReplicaSpan]:
    return [
        ReplicaSpan(
            start=e.scaled_up_at,
            end=e.scaled_down_at,
            capacity_class="reserved" if e.capacity_class == "reserved" else "spot",
            gpu_type=e.gpu_type,
            cards=e.cards,
        )
        for e in events
    ]


def capacity_converging(row: EndpointRow, open_events: Iterable[ReplicaEvent]) -> bool | None:
    """Hybrid only: False while a running replica sits on another class than its deployment's."""
    if row.mode != "hybrid":
        return None
    wanted = {HEAD: "reserved", BURST: "spot"}
    return all(wanted.get(e.deployment, e.capacity_class) == e.capacity_class for e in open_events)


def endpoint_view(
    row: EndpointRow,
    offerings: Offerings,
    offering: Offering | None,
    usage: MonthUsage,
    open_events: Iterable[ReplicaEvent],
) -> DedicatedEndpoint:
    """The DedicatedEndpoint record (docs/reference/dedicated.md#endpoint)."""
    if offering is not None:
        bounds = offerings.bounds(offering, row.engine)
        engine_bounds = offering.engine.bounds
    else:  # the model left the catalog: publish neutral bounds, nothing changeable
        bounds = scaling_bounds(offerings.options, DedicatedModelOptions(), 1)
        engine_bounds = unknown_model_bounds()
    live = live_counts(row)
    return DedicatedEndpoint(
        endpoint_id=row.id,
        model_id=row.model_id,
        alias=row.alias,
        mode=row.mode,
        min_replicas=row.min_replicas,
        max_replicas=row.max_replicas,
        reserved_floor=row.reserved_floor,
        status=presented_status(row),
        created_at=row.created_at,
        cards_per_replica=row.cards_per_replica,
        live=None if live is None else LiveReplicas(replicas_ready=live[0], replicas_total=live[1]),
        month_minutes=MonthMinutes(reserved=usage.minutes_reserved, spot=usage.minutes_spot),
        month_cost=usage.cost,
        month_cost_usd=usage.cost,
        month_cost_rate_matches_card=usage.rate_matches_card if offering is not None else None,
        scaling=scaling_state(row.scaling, bounds),
        scaling_bounds=bounds,
        mode_changed_at=row.mode_changed_at,
        previous_mode=row.previous_mode,
        engine=row.engine,
        engine_bounds=engine_bounds,
        engine_changed_at=row.engine_changed_at,
        capacity_converging=capacity_converging(
            row, [e for e in open_events if e.scaled_down_at is None]
        ),
    )
