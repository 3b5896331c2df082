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
  checker ended before: the verdict comes ``failure_threshold - 1`` periods
  after the first check that found it unreachable (checks refused at once when
  the host is up; a vanished host's checks also wait their timeout, which only
  makes the first failed check earlier still). That first failed check is the
  latest moment the node can have died, so the life ends there: never billed
  past the evidence, at most one period after the real death.
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
        """From the first failed check to the verdict."""
        return timedelta(milliseconds=self.period_ms * max(0, self.failure_threshold - 1))


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
