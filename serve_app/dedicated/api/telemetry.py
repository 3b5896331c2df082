"""Monitoring records of docs/reference/dedicated.md#monitoring-records from measured data only.

- Telemetry: the calls the gateway measured through the alias (outcomes,
  TTFT, latency, cold waits, tokens; prefix-cache hits from the engine's own
  cached-token counts).
- Scaling history: the replica lifetimes the reconciler recorded, with the
  calls each replica served.
- Replica health: counters sampled from running replicas; an endpoint with
  no ready replica is reported unsampled and is never woken for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from serve_app.dedicated.alias import app_name_for
from serve_app.dedicated.api.views import live_counts
from serve_app.dedicated.control.backend import ServeBackend
from serve_app.dedicated.offer.scaling import BURST, HEAD
from serve_app.dedicated.options import DedicatedOptions
from serve_app.dedicated.store import DedicatedStore, EndpointRow, ReplicaEvent
from serve_app.protocol.dedicated import (
    DedicatedColdWait,
    DedicatedPercentiles,
    DedicatedPrefixCache,
    DedicatedReplicaHealth,
    DedicatedScalingEvent,
    DedicatedScalingHistory,
    DedicatedTelemetry,
    QueueDepth,
    ReplicaSample,
    RequestOutcomes,
    TokenTotals,
    Window,
)
from serve_app.protocol.errors import ModelUnavailableError

WINDOWS: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
CapacityVerdict = Literal["no_wake_observed", "constrained", "unknown"]
HealthVerdict = Literal["ok", "degraded", "unknown"]
DEGRADED_SHARE = 0.5
"""A replica decoding slower than this share of the expected rate is degraded."""


def percentile(values: Sequence[int], share: float) -> int | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


def percentiles(values: Sequence[int]) -> DedicatedPercentiles:
    return DedicatedPercentiles(
        p50=percentile(values, 0.50),
        p95=percentile(values, 0.95),
        max=max(values) if values else None,
        measured_requests=len(values),
    )


def _present(rows: Sequence[Any], column: str) -> list[int]:
    return [int(r[column]) for r in rows if r[column] is not None]


def telemetry(
    rows: Sequence[Any], window: Window, now: datetime, block_tokens: int | None
) -> DedicatedTelemetry:
    """Aggregate ``dedicated_requests`` rows of one endpoint over ``window``."""
    outcomes = {k: sum(1 for r in rows if r["outcome"] == k) for k in ("ok", "incomplete", "error")}
    woke = [r for r in rows if r["woke"]]
    cold = percentiles(_present(woke, "cold_wait_ms"))
    measured = [r for r in rows if r["cached_tokens"] is not None]
    prompt = sum(int(r["prompt_tokens"]) for r in measured)
    cached = sum(int(r["cached_tokens"]) for r in measured)
    served = sum(1 for r in rows if r["outcome"] != "error")
    # Calls that had to wait for a replica to boot mean capacity was short of demand.
    verdict: CapacityVerdict = "constrained" if woke else "no_wake_observed"
    return DedicatedTelemetry(
        window=window,
        from_=now - WINDOWS[window],
        to=now,
        requests=RequestOutcomes(**outcomes),
        tokens=TokenTotals(
            prompt=sum(int(r["prompt_tokens"]) for r in rows),
            completion=sum(int(r["completion_tokens"]) for r in rows),
        ),
        ttft_ms=percentiles(_present(rows, "ttft_ms")),
        latency_ms=percentiles(_present(rows, "latency_ms")),
        cold_wait_ms=DedicatedColdWait(**cold.model_dump(), requests_with_wake=len(woke)),
        prefix_cache=DedicatedPrefixCache(
            prompt_tokens=prompt,
            cached_prompt_tokens=cached,
            measured_requests=len(measured),
            hit_rate=(cached / prompt) if measured and prompt else None,
            coverage=(len(measured) / served) if served else 0.0,
            block_tokens=block_tokens,
            block_source="observed" if block_tokens is not None else None,
        ),
        capacity_verdict=verdict if rows else "unknown",
    )


def scaling_event(event: ReplicaEvent, calls: int, now: datetime) -> DedicatedScalingEvent:
    boot = None
    if event.ready_at is not None:
        boot = (event.ready_at - event.scaled_up_at).total_seconds()
    served = None
    if event.ready_at is not None:
        served = ((event.scaled_down_at or now) - event.ready_at).total_seconds()
    released = event.scaled_down_at is not None
    return DedicatedScalingEvent(
        replica_id=event.replica_id,
        version=event.version,
        scaled_up_at=event.scaled_up_at,
        ready_at=event.ready_at,
        drain_requested_at=event.drain_requested_at,
        scaled_down_at=event.scaled_down_at,
        state=event.state,
        error_code=event.error_code,
        calls_total=calls,
        boot_seconds=boot,
        served_seconds=served,
        capacity_class=None if released else event.capacity_class,  # type: ignore[arg-type]
    )


def scaling_history(
    store: DedicatedStore, row: EndpointRow, limit: int, now: datetime
) -> DedicatedScalingHistory:
    """503 when the history cannot be read (docs/reference/dedicated.md#errors)."""
    try:
        events, truncated = store.history(row.id, limit)
        calls = store.calls_by_replica(row.id)
    except Exception:
        raise ModelUnavailableError(
            "The scaling history could not be read; retry shortly.",
            code="scaling_history_unavailable",
        ) from None
    items = [scaling_event(e, calls.get(e.replica_id, 0), now) for e in events]
    return DedicatedScalingHistory(items=items, truncated=truncated)


async def replica_health(
    row: EndpointRow,
    backend: ServeBackend,
    options: DedicatedOptions,
    now: datetime,
) -> DedicatedReplicaHealth:
    """The heads' own counters (``deployments.replica_counters``): a chat replica's
    tokens are the ones it generated, a pooling replica's the inputs it encoded."""
    expected = options.model_options(row.model_id).expected_tok_s
    live = live_counts(row)
    by_deployment: dict[str, int] = dict((row.live or {}).get("ready_by_deployment") or {})
    if row.lifecycle != "active" or live is None or live[0] == 0:
        return _unsampled(now, "no_ready_replica", expected)
    stats = []
    for deployment in (HEAD, BURST):
        ready = int(by_deployment.get(deployment, 0))
        if ready:
            stats.extend(await backend.sample(app_name_for(row.slug), deployment, ready))
    if not stats:
        return _unsampled(now, "no_metrics", expected)
    samples = [
        ReplicaSample(
            tok_s=s.tokens / s.age_s if s.age_s > 0 else 0.0, tokens=s.tokens, age_s=s.age_s
        )
        for s in stats
    ]
    rates = [s.tok_s for s in samples]
    waiting = [s.waiting for s in stats]
    queue = None
    if all(w is not None for w in waiting):
        queue = QueueDepth(
            running=sum(s.running for s in stats), waiting=sum(w or 0 for w in waiting)
        )
    verdict: HealthVerdict
    if expected is None:
        verdict = "unknown"
    else:
        verdict = "degraded" if min(rates) < DEGRADED_SHARE * expected else "ok"
    return DedicatedReplicaHealth(
        sampled_at=now,
        sampled=True,
        reason=None,
        queue=queue,
        replicas=samples,
        expected_tok_s=expected,
        slowest_tok_s=min(rates),
        fastest_tok_s=max(rates),
        replicas_sampled=len(samples),
        verdict=verdict,
    )


def _unsampled(
    now: datetime, reason: Literal["no_ready_replica", "no_metrics"], expected: float | None
) -> DedicatedReplicaHealth:
    return DedicatedReplicaHealth(
        sampled_at=now,
        sampled=False,
        reason=reason,
        queue=None,
        replicas=[],
        expected_tok_s=expected,
        slowest_tok_s=None,
        fastest_tok_s=None,
        replicas_sampled=0,
        verdict="unknown",
    )
