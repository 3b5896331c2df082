"""One memory cgroup per code sandbox run: a cap on the whole run, not per process.

``RLIMIT_AS`` bounds each process, and ``RLIMIT_NPROC`` the number of them, but
their product (512 MiB x 64 processes) is more than a gateway host has, so a
program that forks and fills memory in every child could still exhaust it.
Where the gateway may create cgroups (root with a writable cgroupfs, as on a
VM or a privileged container), each run gets its own child of the gateway's
memory cgroup with a hard limit, and the kernel's OOM killer picks its victim
inside the run only. ``/tmp`` pages (tmpfs) are charged there too.

Both layouts are handled: cgroup v2 (``memory.max``, when the gateway's own
cgroup delegates the memory controller) and v1 (``memory.limit_in_bytes`` in the
``memory`` hierarchy). Elsewhere ``RunCgroups.create`` returns ``None`` (logged
once) and the per-process limits are the only bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class _Layout:
    """Where run cgroups are made and the names of the files that limit them."""

    parent: Path
    limit_files: tuple[str, ...]
    events_file: str
    oom_key: str


def _own_path(version: str) -> str | None:
    """The gateway's cgroup path in the v2 (``"2"``) or v1 memory hierarchy."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if version == "2" and controllers == "":
                return path
            if version == "1" and "memory" in controllers.split(","):
                return path
    return None


def _find_layout(root: Path) -> _Layout | None:
    if (root / "cgroup.controllers").exists():
        own = _own_path("2")
        parent = root / own.lstrip("/") if own is not None else None
        if parent is None or "memory" not in _read(parent / "cgroup.subtree_control").split():
            return None  # the memory controller is not delegated below the gateway's cgroup
        return _Layout(parent, ("memory.max", "memory.swap.max"), "memory.events", "oom_kill")
    own = _own_path("1")
    if own is None or not (root / "memory").is_dir():
        return None
    parent = root / "memory" / own.lstrip("/")
    limits = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
    return _Layout(parent, limits, "memory.oom_control", "oom_kill")


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text()
    return ""


class RunCgroup:
    """The cgroup of one run; ``add`` its processes before the program starts."""

    def __init__(self, path: Path, layout: _Layout) -> None:
        self.path = path
        self.layout = layout

    def add(self, pid: int) -> None:
        """Move ``pid`` in; every process it starts afterwards is in the cgroup too."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        """How many processes of the run the kernel killed for memory."""
        for line in _read(self.path / self.layout.events_file).splitlines():
            key, _, value = line.partition(" ")
            if key == self.layout.oom_key and value.strip().isdigit():
                return int(value)
        return 0

    async def remove(self) -> None:
        """rmdir once the killed processes are gone (a few ms after the kill)."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                await asyncio.sleep(0.02)
        logger.warning("could not remove sandbox cgroup %s", self.path)


class RunCgroups:
    """Makes run cgroups under the gateway's own memory cgroup, where it may."""

    def __init__(self, root: Path = _ROOT) -> None:
        self.root = root
        self._layout: _Layout | None = None
        self._probed = False

    def create(self, limit_bytes: int) -> RunCgroup | None:
        """A new limited cgroup, or None (never an exception: the cap is best effort)."""
        layout = self._probe()
        if layout is None:
            return None
        path = layout.parent / f"gw-sandbox-{uuid.uuid4().hex[:12]}"
        try:
            path.mkdir()
            (path / layout.limit_files[0]).write_text(str(limit_bytes))
        except OSError as err:
            logger.warning("no writable memory cgroup (%s): memory is bounded per process", err)
            self._layout = None  # do not try (and log) on every run
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        group = RunCgroup(path, layout)
        for extra in layout.limit_files[1:]:  # swap: absent without swap accounting
            with contextlib.suppress(OSError):
                (path / extra).write_text(str(0 if extra.endswith("swap.max") else limit_bytes))
        return group

    def _probe(self) -> _Layout | None:
        if not self._probed:
            self._probed = True
            self._layout = _find_layout(self.root)
            if self._layout is None:
                logger.warning(
                    "no writable memory cgroup: a code run's memory is bounded per process only"
                )
        return self._layout
