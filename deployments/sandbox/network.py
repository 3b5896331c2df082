"""Network of a code sandbox run: slirp (default), none, or host.

docs/reference/common.md#limits keeps outbound internet open from the sandbox; the gateway host's
own services (database, Redis, Ray, cloud metadata) must not be. ``slirp`` gives
the sandbox its own network namespace with a user-mode NAT (slirp4netns,
a Debian package): ``--disable-host-loopback`` refuses the host's 127.0.0.1,
and ``prohibit`` routes refuse private, link-local and shared ranges inside
the namespace (the sandboxed program has no capability to remove them).
bwrap waits on a pipe (``--block-fd``, see ``StartupSync``) until the network
is ready, so the program never runs before the guard is in place.

Without slirp4netns the sandbox gets no network at all (logged once), never
the host's network; in production that is a start-up error (``strict``). ``host``
exists for test rigs only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

from serve_app.contract.sandbox import SETUP_TIMEOUT_S

logger = logging.getLogger(__name__)

SLIRP_DNS = "10.0.2.3"
BLOCKED_RANGES = (
    "0.0.0.0/8",
    "10.0.0.0/8",  # the slirp subnet 10.0.2.0/24 stays reachable (more specific route)
    "100.64.0.0/10",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
)


class StartupSync:
    """Pipes that hold bwrap before it starts the program, until the gateway is ready.

    bwrap reports its sandbox's pid on ``--info-fd`` once the namespaces exist,
    then waits on ``--block-fd``: in between, the gateway moves the run into its
    memory cgroup and attaches the network, so the program never runs unguarded.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._fds["info_r"], self._fds["info_w"] = os.pipe()
        self._fds["block_r"], self._fds["block_w"] = os.pipe()

    def bwrap_args(self) -> list[str]:
        return ["--info-fd", str(self._fds["info_w"]), "--block-fd", str(self._fds["block_r"])]

    def child_fds(self) -> tuple[int, ...]:
        return (self._fds["info_w"], self._fds["block_r"])

    def close_child_ends(self) -> None:
        for name in ("info_w", "block_r"):
            self._close(name)

    async def sandbox_pid(self) -> int:
        """The pid (in the gateway's namespace) of the sandbox's first process."""
        return await asyncio.to_thread(_read_child_pid, self._fds["info_r"])

    def release(self) -> None:
        """Let bwrap start the program."""
        os.write(self._fds["block_w"], b"1")

    def close(self) -> None:
        for name in list(self._fds):
            self._close(name)

    def _close(self, name: str) -> None:
        fd = self._fds.pop(name, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


class SandboxNetworkMissing(RuntimeError):
    """The configured network cannot be given (production start-up error)."""


class SandboxNetwork:
    """``none``: loopback only inside the sandbox."""

    def bwrap_args(self) -> list[str]:
        return []

    def resolv_conf(self) -> str:
        return ""

    @contextlib.asynccontextmanager
    async def attached(self, sandbox_pid: int) -> AsyncIterator[None]:
        """The network is ready for the program while this context is open."""
        yield

    @staticmethod
    def for_mode(mode: str, *, strict: bool = False) -> SandboxNetwork:
        """``strict`` (production): a missing slirp4netns is an error, not a sandbox that
        silently runs with no network."""
        if mode == "host":
            return HostNetwork()
        if mode == "slirp":
            slirp = shutil.which("slirp4netns")
            if slirp is not None:
                return SlirpNetwork(slirp)
            if strict:
                raise SandboxNetworkMissing(
                    "code_interpreter.network is slirp but slirp4netns is not installed on "
                    "this node: production refuses to run the sandbox with no network; install "
                    "slirp4netns, or set tools.code_interpreter.network: none to choose it"
                )
            logger.warning("slirp4netns not installed: code sandbox runs get no network")
        return SandboxNetwork()


class HostNetwork(SandboxNetwork):
    """The host's network namespace, loopback included: test rigs only."""

    def bwrap_args(self) -> list[str]:
        return ["--share-net"]

    def resolv_conf(self) -> str:
        path = Path("/etc/resolv.conf")
        return path.read_text() if path.exists() else ""


class SlirpNetwork(SandboxNetwork):
    """Outbound internet through slirp4netns; host loopback and private ranges refused."""

    def __init__(self, slirp: str) -> None:
        self.slirp = slirp
        self.ip = shutil.which("ip") or "/usr/sbin/ip"
        self.nsenter = shutil.which("nsenter")

    def resolv_conf(self) -> str:
        return f"nameserver {SLIRP_DNS}\n"

    @contextlib.asynccontextmanager
    async def attached(self, sandbox_pid: int) -> AsyncIterator[None]:
        slirp: asyncio.subprocess.Process | None = None
        try:
            async with asyncio.timeout(SETUP_TIMEOUT_S):
                await _loopback_ready(sandbox_pid)
                slirp = await self._start_slirp(sandbox_pid)
                await self._block_private_ranges(sandbox_pid)
            yield
        finally:
            if slirp is not None and slirp.returncode is None:
                slirp.kill()
                await slirp.wait()

    async def _start_slirp(self, child: int) -> asyncio.subprocess.Process:
        ready_r, ready_w = os.pipe()
        argv = [self.slirp, "--configure", "--mtu=65520", "--disable-host-loopback"]
        if os.geteuid() != 0:
            argv.append(f"--userns-path=/proc/{child}/ns/user")
        argv += ["--netns-type=path", f"--ready-fd={ready_w}", f"/proc/{child}/ns/net", "tap0"]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                pass_fds=(ready_w,),
            )
            os.close(ready_w)
            ready_w = -1
            if await asyncio.to_thread(os.read, ready_r, 1) != b"1":
                raise RuntimeError("slirp4netns did not configure the sandbox network")
            return process
        finally:
            os.close(ready_r)
            if ready_w >= 0:
                os.close(ready_w)

    async def _block_private_ranges(self, child: int) -> None:
        """``prohibit`` routes in the sandbox's namespace (root, or the namespace's owner).

        One ``ip -batch`` run adds them all: one process per sandbox run, not one per range.
        """
        if self.nsenter is None or not Path(self.ip).exists():
            logger.warning("nsenter/ip missing: private ranges stay reachable from the sandbox")
            return
        enter = [self.nsenter, f"--target={child}", "--net"]
        if os.geteuid() != 0:
            enter += ["--user", "--preserve-credentials"]
        batch = "".join(f"route add prohibit {cidr}\n" for cidr in BLOCKED_RANGES)
        process = await asyncio.create_subprocess_exec(
            *enter,
            self.ip,
            "-batch",
            "-",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await process.communicate(batch.encode())
        if process.returncode != 0:
            detail = err.decode(errors="replace").strip()
            raise RuntimeError(f"could not block private ranges in the sandbox network: {detail}")


async def _loopback_ready(child: int) -> None:
    """Wait until bwrap has configured ``lo`` in the new network namespace.

    bwrap reports the child's pid before that child has set up loopback; if
    slirp4netns (which brings ``lo`` up too) runs at the same moment, bwrap's
    own setup fails and the run dies. The local table lists 127.0.0.1 only once
    the address is added and the link is up, which is the last step of bwrap's
    setup; it is read from the child's ``/proc`` view, so no process is spawned.
    """
    trie = Path(f"/proc/{child}/net/fib_trie")
    while True:
        try:
            if "127.0.0.1" in await asyncio.to_thread(trie.read_text):
                return
        except OSError:
            raise RuntimeError("the sandbox exited while its network was set up") from None
        await asyncio.sleep(0.002)


def _read_child_pid(fd: int) -> int:
    """bwrap writes ``{"child-pid": N}`` on ``--info-fd`` once the namespaces exist."""
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        with contextlib.suppress(ValueError):
            return int(json.loads(data)["child-pid"])
    raise RuntimeError("bwrap exited before reporting its sandbox")
