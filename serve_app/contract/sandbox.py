"""The code_interpreter sandbox as both sides see it: its settings and what a run returns.

Both sides read the settings (``tools.code_interpreter`` of the Serve args): the
gateway validates them as part of its ``ToolsOptions`` (``serve_app.tools.config``),
and the tool-runner deployment validates them again in its own replica
(``deployments.sandbox``), where they arrive as a plain dict. A run's result
(``CodeRun``) and the runner's reply (``RunnerReply``) cross the tool runner's
DeploymentHandle; ``SandboxUnavailableError`` is how either side says no sandbox
could run the code; ``SETUP_TIMEOUT_S`` bounds a sandbox's set-up, which the
gateway's handle waits beyond.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SETUP_TIMEOUT_S = 10.0
"""Most a sandbox's set-up (network, cgroup) may take before the program starts."""


@dataclass
class CodeRun:
    """What one run produced; ``timed_out`` runs are still completed runs."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    seconds: float
    memory_killed: bool = False

    def text_for_model(self) -> str:
        status = f"exit_code: {self.exit_code}"
        if self.timed_out:
            status += " (killed: time limit)"
        elif self.memory_killed:
            status += " (a process was killed: memory limit)"
        parts = [status]
        if self.stdout:
            parts.append("stdout:\n" + self.stdout)
        if self.stderr:
            parts.append("stderr:\n" + self.stderr)
        return "\n".join(parts)


class SandboxUnavailableError(RuntimeError):
    """No isolation mechanism on this machine: code is never run unsandboxed."""


@dataclass(frozen=True)
class RunnerReply:
    """One run's result, or why no sandbox could run it (the tool runner's answer)."""

    run: CodeRun | None = None
    unavailable: str | None = None


class CodeInterpreterOptions(BaseModel):
    """The bubblewrap sandbox of ``code_interpreter`` (docs/reference/common.md#limits: code run
    limits)."""

    model_config = ConfigDict(extra="forbid")

    python: str = Field(
        default="/usr/bin/python3", description="Interpreter inside the sandbox (from /usr)."
    )
    network: Literal["slirp", "none", "host"] = Field(
        default="slirp",
        description="slirp: outbound internet through slirp4netns, host loopback and "
        "private ranges blocked; none: no network; host: the host's network (loopback "
        "included; never in production).",
    )
    memory_mb: int = Field(default=512, ge=64, description="Address space per process.")
    run_memory_mb: int = Field(
        default=1024,
        ge=64,
        description="Memory of a whole run (every process, /tmp included), enforced by a "
        "cgroup where the gateway may create one (root, writable cgroupfs); elsewhere "
        "only memory_mb per process applies.",
    )
    max_processes: int = Field(default=64, ge=4, description="Processes per run.")
    tmp_mb: int = Field(default=64, ge=1, description="Size of the writable /tmp.")
    max_output_bytes: int = Field(
        default=64 * 1024, ge=1024, description="stdout/stderr kept per run (rest dropped)."
    )
    price_per_second: float = Field(
        default=0.0, ge=0, description="Billed per second of sandbox wall time."
    )
    uid_base: int = Field(
        default=200_000,
        ge=1000,
        description="When the gateway runs as root, each run gets a random uid in "
        "[uid_base, uid_base + 65536) so its process limit is its own.",
    )
