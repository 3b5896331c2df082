"""A multi-node Ray cluster on one machine, started the way cluster.yaml starts one.

``ray start --head`` and ``ray start --address ... --resources`` run as
``--block`` children of the test, each in its own process group, so a node is
ended (a spot preemption) or cleaned up by signalling the group it was
started in, never by process name (``ray stop`` would end every Ray on the
machine, other tests' included). Every port is chosen free (6379 stays Redis's),
the session lives in its own short temp dir (Unix socket paths are limited to
107 bytes), and the cluster authenticates with its own token
(``RAY_AUTH_TOKEN``), so it neither reads nor writes the shared
``~/.ray/auth_token`` other Ray processes on the machine use. That token, in
the environment of every process the cluster starts, also finds any of them
left behind at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from serve_app.config import REPO_ROOT
from tests.fixtures.processes import pids_with_environ

OBJECT_STORE_BYTES = 128 * 1024 * 1024
"""Small stores: the test moves no objects, and /dev/shm is shared with other tests."""


_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free port outside the kernel's ephemeral range, not handed out before.

    A port the kernel picks for ``bind(0)`` comes from the ephemeral range, which every
    outgoing connection on this busy machine also draws from: between the pick and the
    agent's bind, one of Ray's own connections took it once ("Address already in use" in
    the runtime-env agent, so its raylet exited and the head node went down mid-test).
    Below that range only an explicit bind can take a port.
    """
    top = min(_ephemeral_low(), 32768)
    rng = secrets.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(10000, top - 12000), top)  # above Redis's 6379
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def _ray_bin() -> str:
    """``ray`` next to this interpreter (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside if beside.exists() else "ray")


def _node_ports() -> list[str]:
    """Distinct ports for one raylet and its agents (two raylets share this machine)."""
    ports = {
        "--node-manager-port": free_port(),
        "--object-manager-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--dashboard-agent-grpc-port": free_port(),
        "--runtime-env-agent-port": free_port(),
        "--metrics-export-port": free_port(),
    }
    return [part for flag, port in ports.items() for part in (flag, str(port))]


@dataclass
class Node:
    """One ``ray start --block`` and the process group it leads."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pgid(self) -> int:
        return self.process.pid  # started with start_new_session: it leads its group

    def kill(self) -> None:
        """SIGKILL the whole group at once: the machine is gone, nothing shuts down."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


@dataclass
class LocalCluster:
    """A head node plus worker nodes; ``close`` ends every process it started."""

    root: Path
    temp_dir: Path
    """Ray's session root for every node of this cluster (sockets, logs)."""
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    nodes: list[Node] = field(default_factory=list)

    @classmethod
    def create(cls, root: Path, extra_env: dict[str, str]) -> LocalCluster:
        env = {
            **os.environ,
            **extra_env,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": f"{REPO_ROOT}:{os.environ.get('PYTHONPATH', '')}",
        }
        env.pop("RAY_ADDRESS", None)
        root.mkdir(parents=True, exist_ok=True)
        temp_dir = Path(tempfile.mkdtemp(prefix="rayc-", dir="/tmp"))
        return cls(root=root, temp_dir=temp_dir, env=env)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self, name: str, args: list[str]) -> Node:
        log = self.root / f"{name}.log"
        command = [
            _ray_bin(),
            "start",
            "--block",
            "--disable-usage-stats",
            "--temp-dir",
            str(self.temp_dir),
            "--object-store-memory",
            str(OBJECT_STORE_BYTES),
            "--min-worker-port",
            "0",
            "--max-worker-port",
            "0",
            *_node_ports(),
            *args,
        ]
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        node = Node(name, process, log)
        self.nodes.append(node)
        return node

    def start_head(self, num_cpus: float, resources: dict[str, float]) -> Node:
        node = self._start(
            "head",
            [
                "--head",
                "--port",
                str(self.port),
                "--ray-client-server-port",
                str(free_port()),
                "--include-dashboard",
                "false",
                "--num-cpus",
                str(num_cpus),
                "--resources",
                json.dumps(resources),
            ],
        )
        self._wait_listening(self.port, node, timeout=60)
        return node

    def add_node(self, name: str, num_cpus: float, resources: dict[str, float]) -> Node:
        """A worker node as cluster.yaml's workers start: ``--address`` and ``--resources``."""
        return self._start(
            name,
            [
                "--address",
                self.address,
                "--num-cpus",
                str(num_cpus),
                "--resources",
                json.dumps(resources),
            ],
        )

    def _wait_listening(self, port: int, node: Node, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.process.poll() is not None:
                raise RuntimeError(f"{node.name} exited: {node.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return
            time.sleep(0.25)
        raise TimeoutError(f"{node.name} did not listen on {port} within {timeout} s")

    def stragglers(self) -> list[int]:
        """Live processes this cluster started, wherever they are (its token is in their
        environment; process titles are rewritten by Ray, environments are not)."""
        return pids_with_environ(f"RAY_AUTH_TOKEN={self.env['RAY_AUTH_TOKEN']}")

    def close(self) -> list[int]:
        """End every node group, then any process of this cluster still running (a
        worker that left its group); keep the logs under ``root`` and remove the session
        dir. Returns the latter's pids."""
        for node in self.nodes:
            node.kill()
        left = self.stragglers()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        logs = self.temp_dir / "session_latest" / "logs"
        with contextlib.suppress(OSError, shutil.Error):
            shutil.copytree(logs, self.root / "ray-logs", symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left
