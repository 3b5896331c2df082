"""When a replica really died, from Ray's own records: the end of a billed life.

The meter sees a replica gone only when Serve stops listing it, and Serve
learns of a lost node only from the GCS, which declares a node dead after
``health_check_failure_threshold`` consecutive failed health checks
``health_check_period_ms`` apart (about 15 s with Ray's defaults). Closing the
life at that observation would bill a preempted spot replica for time it was
already gone. Ray's records say better:

- the node table's ``end_time_ms`` with its death reason. A node that left in an
  orderly way (``ray stop``, an autoscaler drain, a preemption notice the
  autoscaler drained) ended at that moment. A node declared dead by the health
  checker ended earlier: the GCS counts a node healthy while its raylet reports
  (syncer messages) or answers a check, checks it once a period has passed in
  silence, and gives its verdict after ``failure_threshold`` failed checks a
  period apart. The verdict thus comes ``failure_threshold`` periods (plus the
  checks' own time) after the last moment the GCS knew the node alive, so the
  life ends at ``end_time_ms - failure_threshold x period``: never before that
  last evidence of life, and, while checks fail at once (a dead raylet on a
  live host refuses the connection), not after the first check that found the
  node gone. A vanished host's checks also wait their timeout each, which only
  moves the estimate later, towards what was observed.
- otherwise the actor table's ``end_time`` (a replica process that crashed or
  was stopped on a node that lives on): the GCS records it as it happens.

Neither is available when the GCS no longer holds the record or cannot be
reached; the meter then falls back to its own first observation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

HEALTH_CHECK_VERDICT = "health check failed"
"""How the GCS words a node death declared by its health checker (``NodeDeathInfo``)."""


@dataclass(frozen=True)
class HealthCheckWindow:
    """The GCS health checker's settings (``RayConfig``): how late its verdict comes."""

    period_ms: int
    failure_threshold: int

    @property
    def verdict_delay(self) -> timedelta:
        """From the last moment the node was known alive to the verdict (at least)."""
        return timedelta(milliseconds=self.period_ms * max(0, self.failure_threshold))


@dataclass(frozen=True)
class ReplicaDeath:
    """The moment a replica's process ended and whether its node went with it."""

    at: datetime
    node_lost: bool
    reason: str
    """Ray's words (death reason and message), for the log."""


def _from_ms(value_ms: int) -> datetime:
    return datetime.fromtimestamp(value_ms / 1000, UTC)


def node_death(
    end_time_ms: int, reason: str, message: str, window: HealthCheckWindow
) -> ReplicaDeath | None:
    """A dead node's end as evidence for its replicas; None without a recorded end."""
    if end_time_ms <= 0:
        return None
    at = _from_ms(end_time_ms)
    if HEALTH_CHECK_VERDICT in message.lower():
        at -= window.verdict_delay
    return ReplicaDeath(at=at, node_lost=True, reason=f"{reason}: {message}".strip(": "))


def actor_death(state: str, end_time_ms: int, cause: str = "") -> ReplicaDeath | None:
    """A dead replica actor's recorded end; None while it lives or without a record."""
    if state != "DEAD" or end_time_ms <= 0:
        return None
    return ReplicaDeath(at=_from_ms(end_time_ms), node_lost=False, reason=cause[:300])
