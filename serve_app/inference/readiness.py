"""Whether a head can take calls now, from Ray Serve's real state.

A call to a head that is still starting would otherwise wait silently in Ray's
queue; the spec wants an immediate 503 ``model_warming`` with ``Retry-After``
instead, or ``model_unavailable`` when the head failed. Serve's status is read
by one background poll per gateway replica, never per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from serve_app.protocol.errors import ModelUnavailableError, model_warming

logger = logging.getLogger(__name__)

WARMING = "warming"
READY = "ready"
FAILED = "failed"


@dataclass(frozen=True)
class HeadState:
    """A head's condition as last observed."""

    state: str
    detail: str = ""


StatusSource = Callable[[], dict[str, HeadState]]


def serve_status_source(app_name: str, deployments: dict[str, str]) -> StatusSource:
    """Reads ``serve.status()`` and maps each model's deployment to a ``HeadState``.

    ``deployments`` maps model id -> deployment name inside ``app_name``.
    """

    def read() -> dict[str, HeadState]:
        from ray import serve

        app = serve.status().applications.get(app_name)
        result: dict[str, HeadState] = {}
        for model_id, name in deployments.items():
            dep = app.deployments.get(name) if app else None
            result[model_id] = _classify(dep)
        return result

    return read


def _classify(dep: object | None) -> HeadState:
    if dep is None:
        return HeadState(WARMING, "not deployed yet")
    status = str(getattr(dep, "status", ""))
    replicas = dict(getattr(dep, "replica_states", {}) or {})
    running = int(replicas.get("RUNNING", 0))
    if running > 0:
        return HeadState(READY)
    if "DEPLOY_FAILED" in status or "UNHEALTHY" in status:
        return HeadState(FAILED, str(getattr(dep, "message", ""))[:200])
    if "HEALTHY" in status and not replicas:
        return HeadState(READY, "scaled to zero; the call boots a replica")
    return HeadState(WARMING, status)


class HeadReadiness:
    """Cached head states, refreshed by a background task."""

    def __init__(
        self,
        source: StatusSource | None,
        refresh_s: float = 2.0,
        warming_retry_after_s: int = 10,
    ) -> None:
        self._source = source
        self._refresh_s = refresh_s
        self._retry_after = warming_retry_after_s
        self._states: dict[str, HeadState] = {}
        self._task: asyncio.Task[None] | None = None
        self._last_refresh = 0.0

    def check(self, model_id: str) -> None:
        """Raise the spec's 503 when the head cannot take a call now."""
        if self._source is None:
            return
        self._ensure_polling()
        state = self._states.get(model_id)
        if state is None or state.state == READY:
            return  # unknown yet: let the call try rather than refuse it
        if state.state == WARMING:
            raise model_warming(model_id, self._retry_after)
        raise ModelUnavailableError(
            f"Model '{model_id}' is unavailable ({state.detail or 'no healthy replica'})."
        )

    def _ensure_polling(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        assert self._source is not None
        while True:
            try:
                self._states = await asyncio.to_thread(self._source)
                self._last_refresh = time.monotonic()
            except RuntimeError as err:
                if "shutdown" in str(err):
                    return  # the replica is stopping; nothing left to serve
                logger.warning("could not read Serve status", exc_info=True)
            except Exception:  # keep serving on the last known states
                logger.warning("could not read Serve status", exc_info=True)
            await asyncio.sleep(self._refresh_s)
