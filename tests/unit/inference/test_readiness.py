"""503 ``model_warming`` / ``model_unavailable`` from Serve's state
(docs/reference/common.md#error-codes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from serve_app.heads.waker import HeadWaker
from serve_app.inference.readiness import (
    ASLEEP,
    FAILED,
    READY,
    STOPPING,
    WARMING,
    HeadReadiness,
    HeadState,
    StatusUnknownError,
    _classify,
    serve_status_source,
)
from serve_app.protocol.errors import ModelUnavailableError
from tests.fixtures.gateway import GatewayHarness
from tests.fixtures.waiting import until


def _dep(status: str, **replicas: int) -> dict[str, Any]:
    """A deployment's entry of Serve's instance details, as the controller sends it."""
    states = [
        {"replica_id": f"{state}-{i}", "state": state}
        for state, n in replicas.items()
        for i in range(n)
    ]
    return {"status": status, "replicas": states, "message": "boom"}


def test_classify_serve_deployment_states() -> None:
    assert _classify(None).state == WARMING
    assert _classify(_dep("UPDATING", STARTING=1)).state == WARMING
    assert _classify(_dep("UPDATING", RUNNING=1, STARTING=1)).state == READY
    # After a ServeController restart its live replicas are RECOVERING: they still serve.
    assert _classify(_dep("UPDATING", RECOVERING=1)).state == READY
    assert _classify(_dep("HEALTHY", PENDING_MIGRATION=1)).state == READY
    assert _classify(_dep("DeploymentStatus.DEPLOY_FAILED")).state == FAILED
    assert _classify(_dep("UNHEALTHY", STARTING=1)).state == FAILED
    assert _classify(_dep("HEALTHY")).state == ASLEEP  # scaled to zero while idle
    assert _classify(_dep("DOWNSCALING", STOPPING=1)).state == STOPPING  # going to sleep
    assert _classify(_dep("UPDATING", STOPPING=1, STARTING=1)).state == WARMING  # replaced


def test_classify_reads_serves_enums() -> None:
    """The controller's details hold Serve's enums (a python-mode dump), not their names."""
    from ray.serve._private.common import DeploymentStatus, ReplicaState

    running = {"status": DeploymentStatus.HEALTHY, "replicas": [{"state": ReplicaState.RUNNING}]}
    assert _classify(running).state == READY
    failed = {"status": DeploymentStatus.DEPLOY_FAILED, "replicas": [], "message": "no GPU"}
    assert _classify(failed) == HeadState(FAILED, "no GPU")
    assert _classify({"status": DeploymentStatus.HEALTHY, "replicas": []}).state == ASLEEP


def test_status_source_maps_models_and_waits_for_a_recovering_controller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from serve_app.inference import readiness

    details: dict[str, Any] = {
        "applications": {"gateway": {"deployments": {"chat-a": _dep("HEALTHY", RUNNING=1)}}}
    }
    monkeypatch.setattr(readiness, "serve_details", lambda: details)
    read = serve_status_source("gateway", {"a": "chat-a", "b": "chat-b"})
    assert read() == {"a": HeadState(READY), "b": HeadState(WARMING, "not deployed yet")}
    details["applications"] = {}  # a restarted controller that has not found the app yet
    with pytest.raises(StatusUnknownError):
        read()


def _polled_once(readiness: HeadReadiness) -> Callable[[], bool]:
    return lambda: readiness._last_refresh > 0


async def _polled(states: dict[str, HeadState]) -> HeadReadiness:
    readiness = HeadReadiness(lambda: states, refresh_s=0.01, warming_retry_after_s=7)
    readiness.check("any")  # starts the poll
    await until(_polled_once(readiness))
    return readiness


async def test_check_raises_the_spec_errors() -> None:
    readiness = await _polled(
        {"a": HeadState(WARMING), "b": HeadState(FAILED, "crashed"), "c": HeadState(READY)}
    )
    with pytest.raises(ModelUnavailableError) as warming:
        readiness.check("a")
    assert warming.value.code == "model_warming"
    assert warming.value.headers == {"Retry-After": "7"}
    with pytest.raises(ModelUnavailableError) as failed:
        readiness.check("b")
    assert failed.value.code == "model_unavailable"
    readiness.check("c")


async def test_route_answers_503_while_warming(gateway: GatewayHarness) -> None:
    text = gateway.app.state.gateway.text
    text.readiness = await _polled({"scripted-chat": HeadState(WARMING)})
    body = {"model": "scripted-chat", "messages": [{"role": "user", "content": "hi"}]}
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=body, timeout=5)
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "7"
    assert resp.json()["error"]["code"] == "model_warming"


async def test_a_sleeping_head_answers_warming_and_is_woken_once() -> None:
    woken: list[str] = []
    readiness = HeadReadiness(
        lambda: {"s": HeadState(ASLEEP)},
        refresh_s=0.01,
        warming_retry_after_s=7,
        waker=woken.append,
    )
    readiness.check("s")  # unknown yet: let through, starts the poll
    await until(_polled_once(readiness))
    for _ in range(2):
        with pytest.raises(ModelUnavailableError) as warming:
            readiness.check("s")
        assert warming.value.code == "model_warming"
        assert warming.value.headers == {"Retry-After": "7"}
    assert woken == ["s", "s"]  # the waker itself keeps one call in flight


async def test_a_sleeping_head_without_a_waker_is_called_directly() -> None:
    readiness = await _polled({"s": HeadState(ASLEEP)})
    readiness.check("s")


class _Response:
    def __init__(self, done: asyncio.Event) -> None:
        self.done = done
        self.cancelled = False

    def __await__(self):  # type: ignore[no-untyped-def]
        return self.done.wait().__await__()

    def cancel(self) -> None:
        self.cancelled = True


class _Handle:
    def __init__(self) -> None:
        self.calls: list[_Response] = []
        self.done = asyncio.Event()
        self.wake = SimpleNamespace(remote=self._remote)

    def _remote(self) -> _Response:
        self.calls.append(_Response(self.done))
        return self.calls[-1]


async def test_the_waker_keeps_one_wake_call_per_head_in_flight() -> None:
    handle = _Handle()
    waker = HeadWaker({"s": handle}, bound_s=5)
    waker("s")
    waker("s")
    waker("unknown")  # not a bound head: ignored
    await until(lambda: len(handle.calls) == 1)
    assert set(waker._pending) == {"s"}
    handle.done.set()  # a replica is up and answered
    await until(waker._pending["s"].done)
    waker("s")  # asleep again later: a new call
    await until(lambda: len(handle.calls) == 2)


async def test_a_head_whose_wake_call_was_answered_is_ready_before_the_next_poll() -> None:
    # Seen in the 8G every-route run: the head answered its wake call, the caller's retry came
    # before the next status poll, and got a second 503.
    handle = _Handle()
    readiness = HeadReadiness(lambda: {"s": HeadState(ASLEEP)}, refresh_s=3600)
    waker = HeadWaker({"s": handle}, bound_s=5, on_awake=readiness.note_answering)
    readiness._waker = waker
    readiness.check("s")  # the first poll is started; nothing known yet
    await until(lambda: "s" in readiness._states)
    with pytest.raises(ModelUnavailableError):
        readiness.check("s")  # asleep: 503 model_warming, wake call sent
    await until(lambda: len(handle.calls) == 1)
    handle.done.set()  # a replica is up and answered the wake call
    await until(waker._pending["s"].done)
    readiness.check("s")  # no 503, though no poll has run since


async def test_a_wake_call_that_waits_too_long_is_cancelled() -> None:
    handle = _Handle()
    waker = HeadWaker({"s": handle}, bound_s=0.01)
    waker("s")
    await until(lambda: bool(handle.calls) and handle.calls[0].cancelled)


async def test_a_head_seen_answering_is_ready_before_the_next_poll_says_so() -> None:
    polls: list[float] = []

    def stale() -> dict[str, HeadState]:
        polls.append(time.monotonic())
        return {"s": HeadState(WARMING, "UPSCALING")}  # the poll lags: begun before the answer

    readiness = HeadReadiness(stale, refresh_s=0.01)
    readiness.check("s")
    await until(_polled_once(readiness))
    with pytest.raises(ModelUnavailableError):
        readiness.check("s")
    readiness.note_answering("s")
    answered = time.monotonic()
    readiness.check("s")  # no 503: a call was just accepted

    def a_later_poll_finished() -> bool:
        # Polls run one at a time: the second read after the answer began after the first
        # had finished, so after the answer too (the first may have begun before it).
        later = [at for at in polls if at > answered]
        return len(later) >= 2 and readiness._last_refresh > later[1]

    await until(a_later_poll_finished)  # polls begun after the answer count again
    with pytest.raises(ModelUnavailableError):
        readiness.check("s")


async def test_a_poll_that_knows_nothing_keeps_the_last_states() -> None:
    from serve_app.inference.readiness import StatusUnknownError

    answers: list[dict[str, HeadState] | None] = [{"s": HeadState(READY)}]
    reads: list[None] = []

    def counted() -> dict[str, HeadState]:
        reads.append(None)
        if answers[-1] is None:
            raise StatusUnknownError("controller recovering")
        return answers[-1]

    readiness = HeadReadiness(counted, refresh_s=0.01)
    readiness.check("s")
    await until(_polled_once(readiness))
    answers.append(None)  # the controller restarts
    unknown_from = len(reads)
    # The second read after it began after the first had ended: a whole poll knew nothing.
    await until(lambda: len(reads) >= unknown_from + 2)
    readiness.check("s")  # still ready: no 503 for a head that never stopped


async def test_a_refused_wake_leaves_no_start_behind() -> None:
    """No room could be made: the next caller's ``Retry-After`` is counted from its own
    attempt. Before, the refused attempt's start stayed and the next 503 said the wake was
    long overdue (5 s) although none had run."""
    now = [1000.0]
    refused: list[str] = []

    async def no_room(model_id: str) -> bool:
        return False

    readiness = HeadReadiness(
        lambda: {"s": HeadState(ASLEEP)},
        refresh_s=3600,
        clock=lambda: now[0],
        wake_s={"s": 40.0},
    )

    def on_refused(model_id: str) -> None:
        refused.append(model_id)
        readiness.wake_refused(model_id)

    waker = HeadWaker({"s": _Handle()}, bound_s=5, gate=no_room, on_refused=on_refused)
    readiness._waker = waker
    readiness.check("s")  # the first poll is started; nothing known yet
    await until(lambda: "s" in readiness._states)
    with pytest.raises(ModelUnavailableError) as first:
        readiness.check("s")
    await until(waker._pending["s"].done)
    assert refused == ["s"]
    now[0] += 600  # much later, another caller
    with pytest.raises(ModelUnavailableError) as later:
        readiness.check("s")
    assert later.value.headers == first.value.headers  # the whole estimate, not "overdue"
