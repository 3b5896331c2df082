"""The code sandbox as the gateway sees it: the tool-runner deployment, or in-process.

The sandbox itself (bubblewrap, its network and cgroup) lives in ``deployments.sandbox``
and runs in tool-runner replicas (``deployments.tool_runner``); the ingress reaches it
through ``RemoteSandbox``. ``deployments.sandbox.bwrap.BwrapSandbox`` in-process remains
for unit tests and for a config with ``tool_runner.enabled: false``; the composition root
(``serve_app.composition``) builds it, so the gateway's tools import nothing of the heads.
Either way a failure to run is a ``SandboxUnavailableError``, which the tool loop turns
into a failed call (docs/reference/responses.md#output-items).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from serve_app.contract.sandbox import SETUP_TIMEOUT_S, CodeRun, SandboxUnavailableError

logger = logging.getLogger(__name__)

HANDLE_MARGIN_S = SETUP_TIMEOUT_S + 15.0
"""Beyond a run's own limit: sandbox set-up, queueing at a busy replica, the round trip."""


class CodeSandbox(Protocol):
    """A tool-runner handle (``RemoteSandbox``) or an in-process ``BwrapSandbox``."""

    async def run(self, code: str, timeout_s: float) -> CodeRun: ...


class RemoteSandbox:
    """Runs code on the tool-runner deployment through its Serve handle."""

    def __init__(self, handle: Any, margin_s: float = HANDLE_MARGIN_S) -> None:
        self.handle = handle
        self.margin_s = margin_s

    async def run(self, code: str, timeout_s: float) -> CodeRun:
        response = self.handle.run.remote(code, timeout_s)
        try:
            async with asyncio.timeout(timeout_s + self.margin_s):
                reply = await response
        except TimeoutError:
            response.cancel()
            raise SandboxUnavailableError("the code sandbox did not answer in time") from None
        except Exception as err:  # no replica, a replica that died mid-run
            logger.warning("tool runner call failed", exc_info=True)
            raise SandboxUnavailableError(
                f"the code sandbox is unavailable ({type(err).__name__})"
            ) from err
        if reply.run is None:
            raise SandboxUnavailableError(reply.unavailable or "the code sandbox is unavailable")
        run: CodeRun = reply.run
        return run
