"""Whether a head can take calls now, from Ray Serve's real state, and waking sleeping heads.

A call to a head that is still starting would otherwise wait silently in Ray's
queue; the contract wants an immediate 503 ``model_warming`` with ``Retry-After``
instead, or ``model_unavailable`` when the head failed. Serve's status is read
by one background poll per gateway replica, never per request.

A head whose deployment autoscales down to zero replicas sleeps when idle (it holds
no memory: docs/deployment.md, "Memory budget"). A call to a sleeping head answers
503 ``model_warming`` at once and wakes it: the waker sends the head one call that
waits in Serve's queue, and that queued call is the demand Serve's autoscaler
scales up for. State changes (asleep, waking, awake) are logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from serve_app.background import PeriodicLoop
from serve_app.heads.serve_state import serve_details, serve_name
from serve_app.inference.wake_times import WakeTimes
from serve_app.protocol.errors import ModelUnavailableError, model_warming

logger = logging.getLogger(__name__)

WARMING = "warming"
READY = "ready"
FAILED = "failed"
ASLEEP = "asleep"
STOPPING = "stopping"
"""Serve is taking the head's last replica down (scaled to zero while idle, or put to sleep
for another head): no replica takes calls, and it still holds its memory. A call then wakes
it again as it would a sleeping head (it was reported "waking", and its callers waited a
whole wake time for a head nobody had asked to wake)."""
HOLDING_MEMORY = frozenset({WARMING, READY, STOPPING})
"""States in which a head holds (or is about to hold) its memory: what the budget counts."""


@dataclass(frozen=True)
class HeadState:
    """A head's condition as last observed."""

    state: str
    detail: str = ""


class StatusUnknownError(LookupError):
    """Serve's status says nothing of this application now (a ServeController restarting
    recovers its state from the live replicas): keep the last known states meanwhile, or a
    restarted controller would turn every head "warming" for a few seconds."""


StatusSource = Callable[[], dict[str, HeadState]]
Waker = Callable[[str], None]
"""Starts waking a sleeping head (returns at once; repeated calls while it wakes are no-ops)."""


def serve_status_source(app_name: str, deployments: dict[str, str]) -> StatusSource:
    """Reads Serve's instance details and maps each model's deployment to a ``HeadState``.

    ``deployments`` maps model id -> deployment name inside ``app_name``. The details are
    the plain dict the controller sends (``serve_details``; ``serve.status()`` parsed it
    at a cost: 70% of an idle gateway replica's CPU, 9% under load).
    """

    def read() -> dict[str, HeadState]:
        app = ((serve_details() or {}).get("applications") or {}).get(app_name)
        if app is None:  # our own app missing: a restarted controller still recovering
            raise StatusUnknownError(f"application {app_name!r} not in Serve's status yet")
        found = app.get("deployments") or {}
        return {model_id: _classify(found.get(name)) for model_id, name in deployments.items()}

    return read


SERVING_REPLICA_STATES = ("RUNNING", "RECOVERING", "PENDING_MIGRATION")
"""Replica states that take calls. RECOVERING: a live replica a restarted ServeController has
found again and not yet health-checked (counted as not running, it turned every head
"warming" for a poll or two after a controller restart: 4 of 28 calls got a 503 in the fault
suite); PENDING_MIGRATION: running on a node being drained, until its successor is up."""


def _classify(dep: dict[str, Any] | None) -> HeadState:
    """One deployment's entry of the details -> the head's condition."""
    if dep is None:
        return HeadState(WARMING, "not deployed yet")
    status = serve_name(dep.get("status"))
    replicas = Counter(serve_name(r.get("state")) for r in dep.get("replicas") or [])
    if sum(replicas[state] for state in SERVING_REPLICA_STATES) > 0:
        return HeadState(READY)
    if "DEPLOY_FAILED" in status or "UNHEALTHY" in status:
        return HeadState(FAILED, serve_name(dep.get("message"))[:200])
    if "HEALTHY" in status and not replicas:
        return HeadState(ASLEEP, "scaled to zero while idle")
    if replicas and set(replicas) == {"STOPPING"}:
        return HeadState(STOPPING, status)
    return HeadState(WARMING, status)


class HeadReadiness:
    """Cached head states, refreshed by a background task."""

    def __init__(
        self,
        source: StatusSource | None,
        refresh_s: float = 2.0,
        warming_retry_after_s: int = 10,
        waker: Waker | None = None,
        on_use: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wake_s: Mapping[str, float] | None = None,
        room_s: Callable[[str, set[str]], float] | None = None,
    ) -> None:
        """``on_use``: told of every accepted call (the memory budget's last-use order).
        ``warming_retry_after_s``: ``Retry-After`` for a head this replica has not yet seen
        wake and the catalog gives no ``wake_s`` for (head id -> seconds, ``wake_s``);
        later ones say what is left of its last wake (``WakeTimes``); ``room_s(model,
        heads holding memory)``: what making room for its wake adds (the budget keeper)."""
        self._source = source
        self._waker = waker
        self._on_use = on_use
        self._refresh_s = refresh_s
        self._wakes = WakeTimes(warming_retry_after_s, clock, wake_s, lag_s=refresh_s)
        self._room_s = room_s
        self._states: dict[str, HeadState] = {}
        self._loop = PeriodicLoop(
            self._poll,
            refresh_s,
            logger=logger,
            failure="could not read Serve status",
            level=logging.WARNING,
        )
        self._last_refresh = 0.0
        self._answering: dict[str, float] = {}
        """Model id -> when a call to its head was last accepted: newer than a poll begun
        before it, so a head that just woke is not reported warming by a stale poll."""

    def note_answering(self, model_id: str) -> None:
        """A call to ``model_id``'s head was just accepted: it is up, whatever polls said."""
        now = time.monotonic()
        self._answering[model_id] = now
        self._wakes.ended(model_id)
        if self._on_use is not None:
            self._on_use(model_id)
        if model_id in self._states and self._states[model_id].state != READY:
            self._states[model_id] = HeadState(READY)

    def check(self, model_id: str) -> None:
        """Raise the API's 503 when the head cannot take a call now."""
        if self._source is None:
            return
        self._ensure_polling()
        state = self._states.get(model_id)
        if state is None or state.state == READY:
            return  # unknown yet: let the call try rather than refuse it
        if state.state in (ASLEEP, STOPPING):
            if self._waker is None:
                return  # nothing to wake it with: the call itself boots a replica
            self._wakes.began(model_id)
            self._waker(model_id)
            raise model_warming(model_id, self._retry_after_s(model_id))
        if state.state == WARMING:
            raise model_warming(model_id, self._retry_after_s(model_id))
        raise ModelUnavailableError(
            f"Model '{model_id}' is unavailable ({state.detail or 'no healthy replica'})."
        )

    def wake_sent(self, model_id: str) -> None:
        """The waker sent ``model_id``'s wake call (room made): its own wake starts now."""
        self._wakes.sent(model_id)

    def wake_refused(self, model_id: str) -> None:
        """No room could be made for ``model_id``: no wake runs, and the next call's attempt
        is timed from its own start."""
        self._wakes.forget(model_id)

    def _retry_after_s(self, model_id: str) -> int:
        room = 0.0
        if self._room_s is not None:
            holding = {m for m, s in self._states.items() if s.state in HOLDING_MEMORY}
            room = self._room_s(model_id, holding)
        return self._wakes.retry_after_s(model_id, room)

    def _ensure_polling(self) -> None:
        self._loop.start()

    async def _poll(self) -> bool:
        """One read of Serve's status; False once the replica is shutting down."""
        assert self._source is not None
        try:
            began = time.monotonic()
            states = await asyncio.to_thread(self._source)
            for model_id, at in self._answering.items():
                if at > began and model_id in states:  # seen answering after the poll began
                    states[model_id] = HeadState(READY)
            _log_changes(self._states, states)
            self._time_wakes(self._states, states)
            self._states = states
            self._last_refresh = time.monotonic()
        except StatusUnknownError as err:
            logger.info("keeping the last head states: %s", err)
        except RuntimeError as err:
            if "shutdown" in str(err):
                return False  # the replica is stopping; nothing left to serve
            logger.warning("could not read Serve status", exc_info=True)
        except Exception:  # keep serving on the last known states
            logger.warning("could not read Serve status", exc_info=True)
        return True

    def _time_wakes(self, before: dict[str, HeadState], after: dict[str, HeadState]) -> None:
        """A head seen going from asleep to starting began a wake (another replica's call may
        have woken it); one seen answering ended it; one that failed timed nothing."""
        for model_id, state in after.items():
            old = before.get(model_id)
            if state.state == WARMING and old is not None and old.state in (ASLEEP, STOPPING):
                self._wakes.sent(model_id)
            elif state.state == READY:
                self._wakes.ended(model_id)
            elif state.state == FAILED:
                self._wakes.forget(model_id)


_WORDS = {
    READY: "awake",
    ASLEEP: "asleep",
    STOPPING: "going to sleep",
    WARMING: "waking",
    FAILED: "failed",
}


def describe(state: HeadState) -> str:
    """A head's condition in one word, as the logs print it."""
    return _WORDS.get(state.state, state.state)


def _log_changes(before: dict[str, HeadState], after: dict[str, HeadState]) -> None:
    """One line per head whose condition changed (the first poll reports every head)."""
    for model_id, state in sorted(after.items()):
        old = before.get(model_id)
        if old is None or old.state != state.state:
            detail = f" ({state.detail})" if state.detail and state.state != READY else ""
            logger.info("head %s: %s%s", model_id, describe(state), detail)
