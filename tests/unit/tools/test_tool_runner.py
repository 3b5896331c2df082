"""The sandbox in its own deployment: the replica's core, the gateway's handle client, and
the builder binding it next to the ingress."""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

import pytest
import yaml

from deployments.tool_runner import ToolRunnerCore
from serve_app.config import REPO_ROOT
from serve_app.contract.sandbox import CodeRun, RunnerReply, SandboxUnavailableError
from serve_app.tools.sandbox import RemoteSandbox

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")


class _Response:
    """Stands in for a Serve ``DeploymentResponse``: awaitable and cancellable."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.cancelled = False

    def __await__(self) -> Any:
        return self._result().__await__()

    async def _result(self) -> Any:
        if isinstance(self.answer, BaseException):
            raise self.answer
        if self.answer == "hang":
            await asyncio.sleep(60)
        return self.answer

    def cancel(self) -> None:
        self.cancelled = True


class _Method:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, float]] = []
        self.response: _Response | None = None

    def remote(self, code: str, timeout_s: float) -> _Response:
        self.calls.append((code, timeout_s))
        self.response = _Response(self.answer)
        return self.response


class _Handle:
    def __init__(self, answer: Any) -> None:
        self.run = _Method(answer)


RUN = CodeRun(stdout="45\n", stderr="", exit_code=0, timed_out=False, seconds=0.2)


async def test_the_handle_answer_is_the_run() -> None:
    handle = _Handle(RunnerReply(run=RUN))
    assert await RemoteSandbox(handle).run("print(45)", 5) == RUN
    assert handle.run.calls == [("print(45)", 5)]


@pytest.mark.parametrize(
    "answer",
    [RunnerReply(unavailable="bubblewrap (bwrap) is not installed"), RuntimeError("actor died")],
)
async def test_a_runner_that_cannot_run_is_sandbox_unavailable(answer: Any) -> None:
    with pytest.raises(SandboxUnavailableError):
        await RemoteSandbox(_Handle(answer)).run("print(1)", 5)


async def test_a_runner_that_never_answers_is_cancelled_in_bounded_time() -> None:
    handle = _Handle("hang")
    with pytest.raises(SandboxUnavailableError, match="did not answer"):
        await RemoteSandbox(handle, margin_s=0.05).run("print(1)", 0.05)
    assert handle.run.response is not None and handle.run.response.cancelled


@needs_bwrap
async def test_the_replica_core_runs_code_in_bubblewrap() -> None:
    core = ToolRunnerCore({"network": "none"})
    reply = await core.run("print(sum(range(10)))", 10)
    assert reply.run is not None and reply.run.stdout.strip() == "45"


async def test_the_replica_core_reports_a_missing_sandbox_as_an_answer() -> None:
    core = ToolRunnerCore({"network": "none", "python": "/no/such/python3"})
    assert not core.available()
    reply = await core.run("print(1)", 5)
    assert reply.run is None and reply.unavailable


@pytest.mark.parametrize("enabled", [True, False])
def test_the_builder_binds_the_tool_runner_next_to_the_ingress(enabled: bool) -> None:
    from serve_app.builders import build_gateway_app

    args = yaml.safe_load((REPO_ROOT / "configs" / "local.yaml").read_text())["applications"][0][
        "args"
    ]
    args = {**args, "tool_runner": {**args.get("tool_runner", {}), "enabled": enabled}}
    gateway = build_gateway_app(args)._bound_deployment
    runner_app = gateway.init_args[2]
    if not enabled:
        assert runner_app is None
        return
    runner = runner_app._bound_deployment
    assert runner.name == "tool-runner"
    assert runner.ray_actor_options["num_cpus"] < 1
    assert runner.init_args[0]["network"] == "slirp"  # the sandbox options travel with it


@needs_bwrap
def test_the_sandbox_runs_on_uvloop_as_serve_replicas_do() -> None:
    # Serve replicas run on uvloop, whose subprocess_exec refuses user=/group= keywords.
    uvloop = pytest.importorskip("uvloop")

    async def run() -> RunnerReply:
        return await ToolRunnerCore({"network": "none"}).run("import os; print(os.getuid())", 10)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        reply = runner.run(run())
    assert reply.run is not None and reply.run.exit_code == 0, reply
