"""Network of a code sandbox run: slirp (default), none, or host.

Spec 8 keeps outbound internet open from the sandbox; the gateway host's own
services (database, Redis, Ray, cloud metadata) must not be. ``slirp`` gives
the sandbox its own network namespace with a user-mode NAT (slirp4netns,
a Debian package): ``--disable-host-loopback`` refuses the host's 127.0.0.1,
and ``prohibit`` routes refuse private, link-local and shared ranges inside
the namespace (the sandboxed program has no capability to remove them).
bwrap waits on a pipe (``--block-fd``) until the network is ready, so the
program never runs before the guard is in place.

Without slirp4netns the sandbox gets no network at all (logged once), never
the host's network; ``host`` exists for test rigs only.
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
_SETUP_TIMEOUT_S = 10.0


class StartupSync:
    """Pipes that let the gateway set up the network before bwrap starts the program."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._fds: dict[str, int] = {}
        if enabled:
            self._fds["info_r"], self._fds["info_w"] = os.pipe()
            self._fds["block_r"], self._fds["block_w"] = os.pipe()

    def bwrap_args(self) -> list[str]:
        if not self.enabled:
            return []
        return ["--info-fd", str(self._fds["info_w"]), "--block-fd", str(self._fds["block_r"])]

    def child_fds(self) -> tuple[int, ...]:
        return (self._fds["info_w"], self._fds["block_r"]) if self.enabled else ()

    def fd(self, name: str) -> int:
        return self._fds[name]

    def close_child_ends(self) -> None:
        for name in ("info_w", "block_r"):
            self._close(name)

    def close(self) -> None:
        for name in list(self._fds):
            self._close(name)

    def _close(self, name: str) -> None:
        fd = self._fds.pop(name, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


class SandboxNetwork:
    """``none``: loopback only inside the sandbox."""

    def bwrap_args(self) -> list[str]:
        return []

    def resolv_conf(self) -> str:
        return ""

    def sync_fds(self) -> StartupSync:
        return StartupSync(enabled=False)

    @contextlib.asynccontextmanager
    async def attached(self, sync: StartupSync, bwrap_pid: int) -> AsyncIterator[None]:
        yield

    @staticmethod
    def for_mode(mode: str) -> SandboxNetwork:
        if mode == "host":
            return HostNetwork()
        if mode == "slirp":
            slirp = shutil.which("slirp4netns")
            if slirp is not None:
                return SlirpNetwork(slirp)
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

    def sync_fds(self) -> StartupSync:
        return StartupSync(enabled=True)

    @contextlib.asynccontextmanager
    async def attached(self, sync: StartupSync, bwrap_pid: int) -> AsyncIterator[None]:
        sync.close_child_ends()
        slirp: asyncio.subprocess.Process | None = None
        try:
            async with asyncio.timeout(_SETUP_TIMEOUT_S):
                child = await asyncio.to_thread(_read_child_pid, sync.fd("info_r"))
                slirp = await self._start_slirp(child)
                await self._block_private_ranges(child)
            os.write(sync.fd("block_w"), b"1")  # bwrap now starts the program
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
        """``prohibit`` routes in the sandbox's namespace (root, or the namespace's owner)."""
        if self.nsenter is None or not Path(self.ip).exists():
            logger.warning("nsenter/ip missing: private ranges stay reachable from the sandbox")
            return
        enter = [self.nsenter, f"--target={child}", "--net"]
        if os.geteuid() != 0:
            enter += ["--user", "--preserve-credentials"]
        for cidr in BLOCKED_RANGES:
            process = await asyncio.create_subprocess_exec(
                *enter,
                self.ip,
                "route",
                "add",
                "prohibit",
                cidr,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            if await process.wait() != 0:
                raise RuntimeError(f"could not block {cidr} in the sandbox network")


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
