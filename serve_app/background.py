"""The one shape of a periodic background loop in a gateway replica.

The dedicated reconciler and alias cache, the head-readiness poller, the accounts
generation poller and the batch worker each run a step every so often on the replica's
event loop. They used to repeat the same ``start`` / ``stop`` / ``while True`` code; the
rules now live here once:

- ``start`` is idempotent: it starts no second task while one runs (so a caller may
  call it on every request, as the pollers do);
- a step's failure is logged at the owner's level and the loop goes on after the next
  wait (a loop that died on one database error would silently stop reconciling);
  cancellation is never swallowed; while steps keep failing with the same kind of error
  (an outage) only the first is logged with its traceback, and the first success after
  says how many failed (a batch worker polling every 50 ms wrote a traceback per poll
  through a 10 s database outage);
- a step that returns ``False`` ends the loop (nothing left to do: the replica is
  stopping, the poller went idle); ``start`` begins a new one later;
- the wait is ``interval_s`` (a number or a callable read before each wait, so the
  owner can shorten it); zero skips the wait, and ``wake`` ends a wait early;
- ``stop`` cancels the task and waits for it, so nothing of the loop runs afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

Step = Callable[[], Awaitable[object]]


class PeriodicLoop:
    """Runs ``step`` on the running event loop, then waits ``interval_s``, until stopped."""

    def __init__(
        self,
        step: Step,
        interval_s: float | Callable[[], float],
        *,
        logger: logging.Logger,
        failure: str,
        level: int = logging.ERROR,
        wait_first: bool = False,
    ) -> None:
        """``failure``: the log line of a failed step (its traceback attached);
        ``wait_first``: wait one interval before the first step (a heartbeat)."""
        self._step = step
        self._interval = interval_s
        self._logger = logger
        self._failure = failure
        self._level = level
        self._wait_first = wait_first
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing: type[BaseException] | None = None
        self._failures = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the loop unless it runs already (needs a running event loop)."""
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        """End the current wait now (new work arrived)."""
        self._wake.set()

    async def stop(self) -> None:
        """Cancel the loop and wait until it has ended."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self) -> None:
        if self._wait_first:
            await self._wait()
        while True:
            try:
                ended = await self._step() is False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(exc)
            else:
                self._succeeded()
                if ended:
                    return
            await self._wait()

    def _failed(self, exc: Exception) -> None:
        """The first failure of a run of the same kind with its traceback; repeats quietly."""
        self._failures += 1
        if type(exc) is self._failing:
            self._logger.debug("%s (again, %d in a row): %s", self._failure, self._failures, exc)
            return
        self._failing = type(exc)
        self._logger.log(self._level, self._failure, exc_info=exc)

    def _succeeded(self) -> None:
        if self._failures:
            self._logger.warning(
                "%s: recovered after %d failed steps", self._failure, self._failures
            )
        self._failing, self._failures = None, 0

    async def _wait(self) -> None:
        wait = self._interval() if callable(self._interval) else self._interval
        if wait <= 0:
            return
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), wait)
