"""Faults of the serving platform itself, on the shared Serve stack, under light load.

Each case breaks one piece (the ServeController, the gateway replica, a head replica, a
vLLM EngineCore), prints its time to recovery and what was lost, and asserts that nothing
was: calls during the fault end with the contract's 503 or a stream's error event, never a
500 or a hang, and service comes back by itself. Marked ``fault`` and run last (they
replace the SmolLM2 head twice, ~1 min each): docs/deployment.md, "Faults".
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psutil
import pytest

from tests.fixtures.waiting import wait_until
from tests.serve.conftest import PIPER, SMOLLM, ServeStack

pytestmark = [pytest.mark.serve, pytest.mark.fault]

RECOVERY_BOUND_S = 240.0
"""A replaced SmolLM2 head boots in ~30-60 s on two cores; four times that is a failure."""
SCRIPTED = "scripted-e2e"
REPLICA_TITLE = re.compile(r"ray::ServeReplica:[^:\s]+:([^.\s]+)")


def _chat(http: httpx.Client, model: str = SMOLLM, timeout: float = 60) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    return http.post("/v1/chat/completions", json=body, timeout=timeout)


def _replicas() -> dict[int, str]:
    """Live Serve replica processes of this session's Ray: pid -> deployment name.

    Read from the process titles Ray gives replica workers (``ray::ServeReplica:<app>:
    <deployment>``) among this process's descendants: other stacks on the machine have
    replicas of the same names, and the state API would need the dashboard, which this
    stack leaves out.
    """
    found: dict[int, str] = {}
    for process in psutil.Process().children(recursive=True):  # this session's Ray only
        try:
            match = REPLICA_TITLE.match(" ".join(process.cmdline()))
        except psutil.Error:
            continue
        if match:
            found[process.pid] = match.group(1)
    return found


def _replica_pid(deployment: str) -> int:
    (pid,) = [pid for pid, name in _replicas().items() if name == deployment]
    return pid


def _gone(pid: int) -> bool:
    """The process is dead (reaped, or a zombie its parent has not reaped yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _controller_recovered(old_pid: int, always_on: set[str]) -> bool:
    """A new ServeController answers and has recovered every replica it found running.

    A restarted controller takes the live replicas from its checkpoint as RECOVERING and
    moves them to RUNNING once it has reached each; a replica it could not reach it would
    replace (a new pid, caught by the caller). Until then it may not answer at all.
    """
    import ray
    from ray import serve

    try:
        controller = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        if ray.get(controller.get_pid.remote(), timeout=10) == old_pid:
            return False
        applications = serve.status().applications.values()
    except Exception:  # the actor is restarting: no answer yet
        return False
    deployments = {name: d for app in applications for name, d in app.deployments.items()}
    if any("RECOVERING" in d.replica_states for d in deployments.values()):
        return False
    running = {n for n, d in deployments.items() if d.replica_states.get("RUNNING", 0) > 0}
    return always_on <= running


@contextmanager
def _light_load(stack: ServeStack) -> Iterator[Counter[int]]:
    """One short SmolLM2 chat every 0.5 s while the block runs; statuses counted (0 = no
    answer at all: connection refused or reset)."""
    statuses: Counter[int] = Counter()
    stop = threading.Event()

    def run() -> None:
        with stack.http() as http:
            while not stop.is_set():
                try:
                    statuses[_chat(http, timeout=30).status_code] += 1
                except httpx.HTTPError:
                    statuses[0] += 1
                stop.wait(0.5)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield statuses
    finally:
        stop.set()
        thread.join(60)


def _wait_answering(stack: ServeStack, model: str = SMOLLM) -> float:
    """Seconds until ``model`` answers 200 again; anything but 200/503/no-answer fails."""
    started = time.monotonic()
    with stack.http() as http:
        while time.monotonic() - started < RECOVERY_BOUND_S:
            try:
                resp = _chat(http, model, timeout=30)
            except httpx.HTTPError:
                time.sleep(0.5)
                continue
            if resp.status_code == 200:
                return time.monotonic() - started
            assert resp.status_code == 503, resp.text
            time.sleep(0.5)
    raise AssertionError(f"{model} did not answer within {RECOVERY_BOUND_S} s")


def _answered(statuses: Counter[int]) -> Callable[[], bool]:
    """The light load has had an answer (the fault hits a stack already serving it)."""
    return lambda: sum(statuses.values()) > 0


def _report(case: str, recovered_s: float, statuses: Counter[int]) -> None:
    lost = {k: v for k, v in statuses.items() if k not in (200, 503, 0)}
    print(f"\nfault {case}: recovered in {recovered_s:.1f} s; calls during it {dict(statuses)}")
    assert not lost, f"calls answered with something else than 200/503: {lost}"


def test_serve_controller_restart_is_invisible(serve_stack: ServeStack) -> None:
    import ray

    # Heads that never sleep: a sleeping head (or a dedicated endpoint) may scale down on
    # its own meanwhile, which is not a restart.
    always_on = {f"chat-{SMOLLM}", f"chat-{SCRIPTED}", "Gateway", f"speech-{PIPER}", "tool-runner"}
    before = {pid: name for pid, name in _replicas().items() if name in always_on}
    assert set(before.values()) == always_on, before
    with _light_load(serve_stack) as statuses:
        wait_until(_answered(statuses), RECOVERY_BOUND_S)
        controller = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        old_pid = ray.get(controller.get_pid.remote())
        started = time.monotonic()
        ray.kill(controller, no_restart=False)
        # The restarted controller recovers its state from the live replicas: waited for,
        # not slept (it was a fixed 15 s).
        wait_until(lambda: _controller_recovered(old_pid, always_on), RECOVERY_BOUND_S, 0.5)
        with serve_stack.http() as http:
            for model in (SMOLLM, SCRIPTED):
                assert _chat(http, model).status_code == 200, model
            speech = http.post(
                "/v1/audio/speech", json={"model": PIPER, "input": "hi", "voice": "tara"}
            )
            assert speech.status_code == 200, speech.text
        recovered = time.monotonic() - started
    after = _replicas()
    assert set(before) <= set(after), f"replicas restarted: {set(before) - set(after)}"
    assert statuses[200] > 0 and set(statuses) == {200}, dict(statuses)
    _report("ServeController killed", recovered, statuses)


def test_gateway_replica_killed_comes_back(serve_stack: ServeStack) -> None:
    pid = _replica_pid("Gateway")
    with _light_load(serve_stack) as statuses:
        wait_until(_answered(statuses), RECOVERY_BOUND_S)
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: _gone(pid))  # a 200 from here on is the new replica's
        _wait_answering(serve_stack)
        recovered = time.monotonic() - started
    _report("gateway replica SIGKILLed", recovered, statuses)


def test_chat_head_replica_killed_is_replaced(serve_stack: ServeStack) -> None:
    pid = _replica_pid(f"chat-{SMOLLM}")
    with _light_load(serve_stack) as statuses:
        wait_until(_answered(statuses), RECOVERY_BOUND_S)
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        _wait_answering(serve_stack)
        recovered = time.monotonic() - started
    assert _replica_pid(f"chat-{SMOLLM}") != pid
    _report("SmolLM2 head replica SIGKILLed", recovered, statuses)


def _stream_events(stack: ServeStack, out: list[Any]) -> None:
    """A long SmolLM2 stream; its SSE data lines, parsed, appended to ``out``."""
    body = {
        "model": SMOLLM,
        "messages": [{"role": "user", "content": "Count from one to one hundred in words."}],
        "max_tokens": 60,
        "stream": True,
    }
    with stack.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as resp:
        out.append(resp.status_code)
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[len("data: ") :]))


def test_engine_core_killed_ends_streams_and_the_head_is_replaced(
    serve_stack: ServeStack,
) -> None:
    replica = psutil.Process(_replica_pid(f"chat-{SMOLLM}"))
    (core,) = [p for p in replica.children(recursive=True) if "EngineCore" in " ".join(p.cmdline())]
    events: list[Any] = []
    streaming = threading.Thread(target=_stream_events, args=(serve_stack, events), daemon=True)
    with _light_load(serve_stack) as statuses:
        streaming.start()
        wait_until(lambda: len(events) >= 3, RECOVERY_BOUND_S)  # status + two chunks
        started = time.monotonic()
        core.send_signal(signal.SIGKILL)
        streaming.join(60)
        assert not streaming.is_alive(), "the in-flight stream hung after the engine died"
        recovered = _wait_answering(serve_stack)
    assert events[0] == 200
    assert "error" in events[-1], f"the stream did not end with an error event: {events[-1]}"
    assert replica.pid != _replica_pid(f"chat-{SMOLLM}"), "Serve did not replace the head"
    _report("SmolLM2 EngineCore SIGKILLed", time.monotonic() - started, statuses)
    assert recovered > 0
