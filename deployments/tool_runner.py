"""The code_interpreter sandbox as its own Ray Serve deployment (the tool runner).

Untrusted code does not run inside the gateway ingress: that replica holds the database
URL, Redis, every provider key, and sits on the head node. Tool-runner replicas run the
bubblewrap sandbox on nodes that have bubblewrap and slirp4netns installed (cluster.yaml's
cpu-tools nodes offer the ``tool_runner_host`` resource the production config asks for),
each with the CPUs its ``ray_actor_options`` reserve, and scale apart from the ingress. The
gateway calls ``run`` through a handle (``serve_app.tools.sandbox.RemoteSandbox``).

A missing bubblewrap is an answer, not an exception: ``RunnerReply.unavailable`` (in
``serve_app.contract.sandbox``, as it crosses the handle) carries the reason, so the
request's tool call fails cleanly (docs/reference/responses.md#output-items) instead of surfacing
a Ray error.
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve

from deployments.replica_logging import configure_replica_logging
from deployments.sandbox.bwrap import BwrapSandbox
from serve_app.contract.sandbox import (
    CodeInterpreterOptions,
    RunnerReply,
    SandboxUnavailableError,
)

logger = logging.getLogger(__name__)


class ToolRunnerCore:
    """The replica's work without Serve, so it is testable in-process."""

    def __init__(self, options: dict[str, Any], production: bool = False) -> None:
        # production: no silent downgrade to no network (SandboxNetworkMissing at start-up)
        self.sandbox = BwrapSandbox(
            CodeInterpreterOptions.model_validate(options), strict_network=production
        )
        if not self.sandbox.available():
            logger.warning(
                "bubblewrap or %s missing on this node: code_interpreter runs will fail "
                "(install bubblewrap and slirp4netns)",
                self.sandbox.options.python,
            )

    async def run(self, code: str, timeout_s: float) -> RunnerReply:
        try:
            return RunnerReply(run=await self.sandbox.run(code, timeout_s))
        except SandboxUnavailableError as err:
            return RunnerReply(unavailable=str(err))

    def available(self) -> bool:
        return self.sandbox.available()


@serve.deployment(name="ToolRunner")
class ToolRunner(ToolRunnerCore):
    """Tool-runner replicas; sized by ``tool_runner`` in the gateway's Serve args."""

    def __init__(self, options: dict[str, Any], production: bool = False) -> None:
        configure_replica_logging()
        super().__init__(options, production)
