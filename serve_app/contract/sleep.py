"""Sleep orders: the gateway's budget keeper asks a head's autoscaling policy to sleep.

The keeper (``serve_app.heads.budget``) runs in gateway replicas; the policy that scales
a head to zero (``deployments.sleep_policy``) runs inside Serve's controller. They meet
in Ray's internal key-value store (GCS), under the names below: one key per head
deployment, its value the JSON ``{"at": epoch seconds, "for": model id}``. An order older
than ``ORDER_TTL_S`` is ignored, so a forgotten one cannot take a head down later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

NAMESPACE = "gateway-sleep-orders"
ORDER_TTL_S = 120.0


def order_key(app_name: str, deployment_name: str) -> bytes:
    return f"{app_name}#{deployment_name}".encode()


@dataclass(frozen=True)
class SleepOrder:
    at: float
    """When the order was given (epoch seconds)."""
    for_model: str
    """The head it makes room for (for the logs)."""

    def encode(self) -> bytes:
        return json.dumps({"at": self.at, "for": self.for_model}).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> SleepOrder | None:
        if not raw:
            return None
        try:
            value = json.loads(raw)
            return cls(float(value["at"]), str(value["for"]))
        except (ValueError, KeyError, TypeError):
            return None

    def fresh(self, now: float) -> bool:
        return 0 <= now - self.at < ORDER_TTL_S
