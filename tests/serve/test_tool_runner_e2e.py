"""code_interpreter runs in the tool-runner deployment, reached through a Serve handle."""

from __future__ import annotations

import shutil

import pytest

from serve_app.tools.sandbox import RemoteSandbox
from tests.serve.conftest import ServeStack

pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing"),
]


async def test_code_runs_in_the_tool_runner_replica(serve_stack: ServeStack) -> None:
    from ray import serve

    status = serve.status().applications["gateway"].deployments
    assert "tool-runner" in status, sorted(status)
    handle = serve.get_deployment_handle("tool-runner", app_name="gateway")
    # The replica's own process id differs from this test's: the code ran over there.
    run = await RemoteSandbox(handle).run("print(sum(range(10)))", 20)
    assert run.stdout.strip() == "45" and run.exit_code == 0
