"""Sleep orders written where a head's autoscaling policy reads them: Ray's internal KV.

The budget keeper (``serve_app.heads.budget``) decides; the head's policy in Serve's
controller (``deployments.sleep_policy``) carries the order out, only while no request
for the head is running or queued. The key and value formats: ``serve_app.contract.sleep``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from serve_app.contract.sleep import NAMESPACE, SleepOrder, order_key


class RaySleepOrders:
    """One order per head deployment of one Serve application."""

    def __init__(self, app_name: str, deployments: Mapping[str, str]) -> None:
        """``deployments``: model id -> its head's deployment name inside ``app_name``."""
        self._app = app_name
        self._deployments = dict(deployments)

    def order(self, model_id: str, for_model: str) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        value = SleepOrder(time.time(), for_model).encode()
        _internal_kv_put(self._key(model_id), value, overwrite=True, namespace=NAMESPACE)

    def clear(self, model_id: str) -> None:
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(self._key(model_id), namespace=NAMESPACE)

    def read(self, model_id: str) -> SleepOrder | None:
        """The head's last order, if any (``gateway run`` says which head it made room for)."""
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(self._key(model_id), namespace=NAMESPACE)
        return SleepOrder.decode(raw if isinstance(raw, bytes) else None)

    def _key(self, model_id: str) -> bytes:
        return order_key(self._app, self._deployments[model_id])
