"""``Retry-After`` on ``model_warming`` says what is left of the head's slowest recent wake
(serve_app/inference/wake_times.py), on an injected clock."""

from __future__ import annotations

import pytest

from serve_app.inference.readiness import (
    ASLEEP,
    READY,
    STOPPING,
    WARMING,
    HeadReadiness,
    HeadState,
)
from serve_app.inference.wake_times import OVERDUE_S, TIMED_MARGIN, TIMED_SLACK_S, WakeTimes
from serve_app.protocol.errors import ModelUnavailableError
from tests.fixtures.waiting import until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Status:
    """Serve's status of one head ``s`` as the tests set it, counting the polls that read it."""

    def __init__(self) -> None:
        self.states = {"s": HeadState(ASLEEP)}
        self.polls = 0

    def __call__(self) -> dict[str, HeadState]:
        self.polls += 1
        return dict(self.states)

    def set(self, state: HeadState) -> None:
        self.states["s"] = state

    async def next_poll(self) -> None:
        """One whole poll read after the last change."""
        seen = self.polls
        await until(lambda: self.polls >= seen + 2)


def test_a_head_never_seen_waking_gets_the_default() -> None:
    wakes = WakeTimes(10, Clock())
    assert wakes.retry_after_s("m") == 10
    wakes.began("m")
    assert wakes.retry_after_s("m") == 10
    assert wakes.expected_s("m") is None


def test_the_catalogs_wake_time_answers_until_one_is_timed() -> None:
    """A replica's first sight of a wake says the measured ``wake_s`` (one 503 per wake
    for a client honouring it, not one per default 10 s); its own timing then replaces it."""
    clock = Clock()
    wakes = WakeTimes(10, clock, {"m": 90.0})
    wakes.began("m")
    assert wakes.retry_after_s("m") == 108
    assert wakes.retry_after_s("other") == 10
    clock.now += 40
    assert wakes.retry_after_s("m") == 68
    wakes.ended("m")
    wakes.began("m")
    assert wakes.retry_after_s("m") == 70  # this replica's own 40 s now, x 1.5 + 10


def test_later_wakes_get_what_is_left_of_the_last_one() -> None:
    clock = Clock()
    wakes = WakeTimes(10, clock)
    wakes.began("m")
    clock.now += 50
    wakes.ended("m")
    assert wakes.expected_s("m") == 50
    clock.now += 600  # asleep again, then called
    wakes.began("m")
    assert wakes.retry_after_s("m") == round(50 * TIMED_MARGIN + TIMED_SLACK_S)
    clock.now += 30
    assert wakes.retry_after_s("m") == round(50 * TIMED_MARGIN + TIMED_SLACK_S) - 30
    wakes.began("m")  # a second sign of the same wake does not restart it
    assert wakes.retry_after_s("m") == round(50 * TIMED_MARGIN + TIMED_SLACK_S) - 30
    clock.now += 60  # past the expected time: polled, not guessed
    assert wakes.retry_after_s("m") == OVERDUE_S


def test_a_failed_wake_times_nothing() -> None:
    clock = Clock()
    wakes = WakeTimes(10, clock)
    wakes.began("m")
    clock.now += 400
    wakes.forget("m")
    wakes.ended("m")
    assert wakes.expected_s("m") is None
    assert wakes.retry_after_s("m") == 10


def test_each_model_has_its_own_time() -> None:
    clock = Clock()
    wakes = WakeTimes(10, clock)
    for model, took in (("a", 20.0), ("b", 100.0)):
        wakes.began(model)
        clock.now += took
        wakes.ended(model)
    wakes.began("a")
    wakes.began("b")
    assert wakes.retry_after_s("a") == 40
    assert wakes.retry_after_s("b") == 160


async def test_readiness_times_a_wake_and_says_it_on_the_next() -> None:
    """Asleep, called (503 with the default), seen starting, answering 80 s later; asleep
    again: the next call's 503 asks for the last wake's 80 s with the margin."""
    clock = Clock()
    status = Status()

    readiness = HeadReadiness(
        status, refresh_s=0.01, warming_retry_after_s=7, waker=lambda _: None, clock=clock
    )
    readiness.check("s")  # unknown yet: starts the poll
    await status.next_poll()
    with pytest.raises(ModelUnavailableError) as first:
        readiness.check("s")
    assert first.value.headers == {"Retry-After": "7"}
    status.set(HeadState(WARMING, "UPSCALING"))
    await status.next_poll()
    clock.now += 80
    status.set(HeadState(READY))
    await status.next_poll()
    readiness.check("s")
    status.set(HeadState(ASLEEP))
    await status.next_poll()
    clock.now += 900
    with pytest.raises(ModelUnavailableError) as second:
        readiness.check("s")
    assert second.value.headers == {
        "Retry-After": str(round(80 * TIMED_MARGIN + TIMED_SLACK_S) + 1)
    }  # + the poll's lag
    status.set(HeadState(WARMING, "UPSCALING"))
    await status.next_poll()
    clock.now += 40
    with pytest.raises(ModelUnavailableError) as later:
        readiness.check("s")
    assert later.value.headers == {
        "Retry-After": str(round(80 * TIMED_MARGIN + TIMED_SLACK_S) + 1 - 40)
    }


async def test_a_wake_started_by_another_replica_is_timed_from_when_it_is_seen() -> None:
    clock = Clock()
    status = Status()

    readiness = HeadReadiness(status, refresh_s=0.01, clock=clock)
    readiness.check("s")
    await status.next_poll()
    status.set(HeadState(WARMING, "UPSCALING"))  # woken through another gateway replica
    await status.next_poll()
    clock.now += 30
    readiness.note_answering("s")
    assert readiness._wakes.expected_s("s") == 30


def test_room_made_first_is_told_and_not_counted_as_the_heads_wake() -> None:
    """A wake that must wait for room: the first 503 asks for the room's wait plus the
    wake; once the wake is sent, what is left of the wake alone; the head's own time is
    timed from the sending."""
    clock = Clock()
    wakes = WakeTimes(10, clock, {"m": 50.0})
    wakes.began("m")
    assert wakes.retry_after_s("m", room_s=45.0) == 45 + 60
    clock.now += 40  # room made
    wakes.sent("m")
    assert wakes.retry_after_s("m", room_s=45.0) == 60
    clock.now += 55
    wakes.ended("m")
    assert wakes.expected_s("m") == 55
    assert WakeTimes(10, clock).retry_after_s("x", room_s=45.0) == 55  # default + room


async def test_a_head_going_to_sleep_is_woken_by_a_call_and_the_room_wait_told() -> None:
    """A call finding the head's last replica stopping wakes it as it would a sleeping
    head (it was reported "waking" and nobody woke it); ``Retry-After`` adds the room
    the keeper says it must make; the wake is timed from the waker's sending."""
    clock = Clock()
    status = Status()
    woken: list[str] = []
    rooms: list[tuple[str, set[str]]] = []

    def room_s(model: str, holding: set[str]) -> float:
        rooms.append((model, holding))
        return 30.0

    readiness = HeadReadiness(
        status,
        refresh_s=0.01,
        waker=woken.append,
        clock=clock,
        wake_s={"s": 20.0},
        room_s=room_s,
    )
    readiness.check("s")
    status.set(HeadState(STOPPING, "DOWNSCALING"))
    await status.next_poll()
    with pytest.raises(ModelUnavailableError) as first:
        readiness.check("s")
    assert woken == ["s"]
    assert rooms == [("s", {"s"})]  # a stopping head still holds its memory
    assert first.value.headers == {"Retry-After": str(30 + 24 + 1)}  # + the poll's lag
    clock.now += 30
    readiness.wake_sent("s")
    clock.now += 10
    with pytest.raises(ModelUnavailableError) as later:
        readiness.check("s")
    assert later.value.headers == {"Retry-After": "15"}


def test_the_slowest_of_the_last_wakes_counts() -> None:
    """Wakes vary (39 then 58 s for one head on the shared box): the slowest of the last
    three sets the estimate, so one quick wake does not send the next client back early."""
    clock = Clock()
    wakes = WakeTimes(10, clock)
    for took in (58.0, 39.0, 40.0, 41.0):
        wakes.began("m")
        clock.now += took
        wakes.ended("m")
        assert wakes.expected_s("m") == (58.0 if took != 41.0 else 41.0)
