"""Waking a head that Ray Serve scaled down to zero replicas.

Serve scales a deployment up from zero when a handle holds a call for it that no
replica can take: the queued call is the demand its autoscaler sees. So waking a
head is one call of its ``wake`` method (a no-op on the head) kept waiting until a
replica exists and answers it. At most one such call per head is in flight. A ``gate``
(the memory budget keeper, ``serve_app.heads.budget``) runs first: it may put other
heads to sleep to make room, or refuse, and then no wake call is sent (the head's callers
keep getting 503 ``model_warming``; the next call tries again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

WAKE_BOUND_S = 900.0
"""How long one wake call waits for a replica (a cold 1.5B chat head takes ~1-2 min on
two cores); the readiness check sends another on the next call after that."""


class HeadWaker:
    """Sends each sleeping head at most one pending ``wake`` call at a time."""

    def __init__(
        self,
        handles: Mapping[str, Any],
        bound_s: float = WAKE_BOUND_S,
        gate: Callable[[str], Awaitable[bool]] | None = None,
        on_sent: Callable[[str], None] | None = None,
        on_awake: Callable[[str], None] | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        """``gate``: awaited before a wake (the memory budget making room); ``on_sent``:
        told when the wake call goes out (the wake's own time starts there); ``on_awake``:
        told when it is answered, so the head counts as up at once rather than at the next
        status poll (a caller retrying in between would get a second 503); ``on_refused``:
        told when the gate refused, so the next attempt's ``Retry-After`` counts from that
        attempt, not from this one (which would read as long overdue)."""
        self._handles = handles
        self._bound_s = bound_s
        self._gate = gate
        self.on_sent = on_sent
        self.on_awake = on_awake
        self.on_refused = on_refused
        self._pending: dict[str, asyncio.Task[None]] = {}

    def __call__(self, model_id: str) -> None:
        """Start waking ``model_id`` unless a wake call for it is already waiting."""
        task = self._pending.get(model_id)
        if (task is not None and not task.done()) or model_id not in self._handles:
            return
        self._pending[model_id] = asyncio.get_running_loop().create_task(self._wake(model_id))

    async def _wake(self, model_id: str) -> None:
        if self._gate is not None and not await self._allowed(model_id):
            if self.on_refused is not None:
                self.on_refused(model_id)
            return
        started = time.monotonic()
        logger.info("waking head %s", model_id)
        if self.on_sent is not None:
            self.on_sent(model_id)
        response = self._handles[model_id].wake.remote()
        try:
            await asyncio.wait_for(response, self._bound_s)
        except Exception as err:  # the next call to the head sends another
            response.cancel()
            logger.warning("head %s did not wake in %.0f s: %s", model_id, self._bound_s, err)
            return
        logger.info("head %s awake after %.1f s", model_id, time.monotonic() - started)
        if self.on_awake is not None:
            self.on_awake(model_id)

    async def _allowed(self, model_id: str) -> bool:
        """The gate's answer; a gate that fails keeps the head asleep (never an OOM kill)."""
        assert self._gate is not None
        try:
            return await self._gate(model_id)
        except Exception:
            logger.warning(
                "could not make room for head %s; not waking it", model_id, exc_info=True
            )
            return False
