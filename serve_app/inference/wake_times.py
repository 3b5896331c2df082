"""How long a head takes to wake, so ``Retry-After`` on ``model_warming`` says it.

A fixed ``Retry-After: 10`` sent a client honouring it back eight to eleven times during
one wake of the 1.5B tool model (80-110 s on two cores): each retry was another 503 and
another request through the limits. Each gateway replica instead times the wakes it sees
(from the wake's start, its call sent or the head seen starting, to the head answering)
and answers with what is left of the slowest of the last few, with a margin. Before a
replica has timed a head's wake it starts from the catalog's measured ``wake_s`` of the
model, and a head with neither gets the configured default.

A wake the memory budget must first make room for starts late: the heads put to sleep
for it go down only once Serve's averaged request count of each reaches 0 (~30-50 s). So
the wake itself is timed from when its call went out (``sent``; or, for a wake another
replica sent, from when the head was seen starting), and until it is sent ``Retry-After``
adds the wait for room the caller gives (``room_s``): the client comes back once, when
the head answers, instead of once when it should have and again every 5 s after.

On the shared two-core box one head's wakes varied 1.5-2x from one to the next (the
embeddings head 39 then 58 s, as other heads loaded beside it), so a timed wake gets a
margin of a half and the slowest of the last ``HISTORY`` counts; the catalog's figures,
the slowest wake of each head seen over two rounds of every route, a fifth.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping

TIMED_MARGIN = 1.5
"""A wake this replica timed, times this (wakes vary 1.5-2x on a busy two-core box)."""
TIMED_SLACK_S = 10.0
"""Added to a timed wake: a small head's wake is mostly Serve starting its replica actor,
which took 3 s once and 15 s the next (piper, 8G every-route run): without it each such
wake cost two or three 503s."""
DECLARED_MARGIN = 1.2
"""The catalog's ``wake_s`` times this (the slowest wake seen already)."""
HISTORY = 3
"""Timed wakes kept per head; the slowest counts."""
OVERDUE_S = 5
"""``Retry-After`` once a wake has run past its expected time (polled, not guessed)."""


class WakeTimes:
    """The wakes this replica has seen, per model id."""

    def __init__(
        self,
        default_s: int,
        clock: Callable[[], float] = time.monotonic,
        declared: Mapping[str, float] | None = None,
        lag_s: float = 0.0,
    ) -> None:
        """``declared``: head id -> its catalog ``wake_s``, the estimate before a timed
        wake; ``lag_s``: how late this replica sees a head up (its status poll's period)."""
        self._default = default_s
        self._clock = clock
        self._declared = dict(declared or {})
        self._lag_s = lag_s
        self._started: dict[str, float] = {}
        self._sent: dict[str, float] = {}
        self._took: dict[str, deque[float]] = {}

    def began(self, model_id: str) -> None:
        """The head is waking (called while asleep, or seen starting); the first sign counts."""
        self._started.setdefault(model_id, self._clock())

    def sent(self, model_id: str) -> None:
        """The wake itself began (its call went out, or the head was seen starting)."""
        self.began(model_id)
        self._sent.setdefault(model_id, self._clock())

    def ended(self, model_id: str) -> None:
        """The head answers: the wake, if one was timed, took until now (from its sending
        when known: room made for it first is not the head's own time)."""
        start = self._started.pop(model_id, None)
        sent = self._sent.pop(model_id, None)
        if start is not None:
            took = self._clock() - (sent if sent is not None else start)
            self._took.setdefault(model_id, deque(maxlen=HISTORY)).append(took)

    def forget(self, model_id: str) -> None:
        """The wake failed: it times nothing, and the next one starts afresh."""
        self._started.pop(model_id, None)
        self._sent.pop(model_id, None)

    def expected_s(self, model_id: str) -> float | None:
        """The slowest of the last timed wakes of ``model_id`` (its declared one before
        any), or None."""
        timed = self._took.get(model_id)
        if timed:
            return max(timed)
        return self._declared.get(model_id)

    def _with_margin(self, model_id: str) -> float | None:
        timed = self._took.get(model_id)
        if timed:
            return max(timed) * TIMED_MARGIN + TIMED_SLACK_S
        declared = self._declared.get(model_id)
        return declared * DECLARED_MARGIN if declared is not None else None

    def retry_after_s(self, model_id: str, room_s: float = 0.0) -> int:
        """Whole seconds until the head should answer, for ``Retry-After``; ``room_s``:
        what making room for it will take, counted only while its wake is not yet sent."""
        expected = self._with_margin(model_id)
        if expected is None:
            return self._default + math.ceil(room_s)
        now = self._clock()
        sent = self._sent.get(model_id)
        if sent is not None:
            left = expected + self._lag_s - (now - sent)
        else:
            start = self._started.get(model_id)
            left = room_s + expected + self._lag_s - (now - start if start is not None else 0.0)
        if left <= 0:
            return OVERDUE_S
        return max(1, math.ceil(left - 1e-6))  # 80 s x 1.2 is 96, not 97
