"""How long a head takes to wake, so ``Retry-After`` on ``model_warming`` says it.

A fixed ``Retry-After: 10`` sent a client honouring it back eight to eleven times during
one wake of the 1.5B tool model (80-110 s on two cores): each retry was another 503 and
another request through the limits. Each gateway replica instead times the wakes it sees
(from the first sign of the wake, a sleeping head called or seen starting, to the head
answering) and answers with what is left of the last wake's time, with a margin. Before
a replica has timed a head's wake it starts from the catalog's measured ``wake_s`` of the
model, and a head with neither gets the configured default.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

MARGIN = 1.2
"""The last wake's time times this: a wake slowed a little (a busy box, an eviction first)
still ends before the client's retry, and the client pays at most a fifth more wait."""
OVERDUE_S = 5
"""``Retry-After`` once a wake has run past its expected time (polled, not guessed)."""


class WakeTimes:
    """The wakes this replica has seen, per model id."""

    def __init__(
        self,
        default_s: int,
        clock: Callable[[], float] = time.monotonic,
        declared: Mapping[str, float] | None = None,
    ) -> None:
        """``declared``: head id -> its catalog ``wake_s``, the estimate before a timed wake."""
        self._default = default_s
        self._clock = clock
        self._started: dict[str, float] = {}
        self._took: dict[str, float] = dict(declared or {})

    def began(self, model_id: str) -> None:
        """The head is waking (called while asleep, or seen starting); the first sign counts."""
        self._started.setdefault(model_id, self._clock())

    def ended(self, model_id: str) -> None:
        """The head answers: the wake, if one was timed, took until now."""
        start = self._started.pop(model_id, None)
        if start is not None:
            self._took[model_id] = self._clock() - start

    def forget(self, model_id: str) -> None:
        """The wake failed: it times nothing, and the next one starts afresh."""
        self._started.pop(model_id, None)

    def expected_s(self, model_id: str) -> float | None:
        """The last timed wake of ``model_id`` (its declared one before), or None."""
        return self._took.get(model_id)

    def retry_after_s(self, model_id: str) -> int:
        """Whole seconds until the head should answer, for ``Retry-After``."""
        took = self._took.get(model_id)
        if took is None:
            return self._default
        start = self._started.get(model_id)
        elapsed = self._clock() - start if start is not None else 0.0
        left = took * MARGIN - elapsed
        if left <= 0:
            return OVERDUE_S
        return max(1, math.ceil(left - 1e-6))  # 80 s x 1.2 is 96, not 97
