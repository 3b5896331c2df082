"""``code_interpreter``: Python in a fresh bubblewrap sandbox per run
(docs/reference/common.md#limits).

Why bubblewrap: it is a Debian package, needs no daemon, and builds a new
root from nothing on every call, so a run sees no host file it was not given.
Each run gets:

- a new empty root: ``/usr`` read-only (``/usr/local`` hidden), a generated
  ``/etc`` (passwd, hosts, resolv.conf, CA certificates only), a size-capped
  ``/tmp``, a private ``/proc`` and a minimal ``/dev`` (no GPU devices);
- new user, pid, ipc, uts, cgroup and network namespaces, no capabilities,
  no nested user namespaces, a cleared environment (no gateway secrets; bwrap
  itself, which stays visible as the sandbox's pid 1, is started without them);
- resource limits set by a launcher before the program starts (address space,
  processes, file size, CPU seconds, open files); when the gateway runs as
  root, a random unprivileged uid so the process limit is the run's alone;
- a memory cgroup for the whole run where one can be made (``cgroup``);
- the network the ``network`` option names (see ``network``).

A run ends at its wall-clock limit: the sandbox's pid 1 is killed, which takes
every process of the run with it. What was printed until then is returned; a
killed run is a completed run (docs/reference/responses.md#output-items).

As in a notebook cell, a program ending in an expression also prints that
expression's value (``repr``, unless None). Models often write ``17 * 23`` or
``df.describe()`` as the last line instead of printing it, and would otherwise
read back an empty output and have nothing to answer with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deployments.sandbox.cgroup import RunCgroup, RunCgroups
from deployments.sandbox.network import SandboxNetwork, StartupSync
from serve_app.contract.sandbox import (
    SETUP_TIMEOUT_S,
    CodeInterpreterOptions,
    CodeRun,
    SandboxUnavailableError,
)

logger = logging.getLogger(__name__)

_LAUNCHER = """\
import ast, resource, sys, traceback, types
def cap(kind, value):
    resource.setrlimit(kind, (value, value))
cap(resource.RLIMIT_AS, {memory})
cap(resource.RLIMIT_NPROC, {nproc})
cap(resource.RLIMIT_FSIZE, {fsize})
cap(resource.RLIMIT_CPU, {cpu})
cap(resource.RLIMIT_NOFILE, 256)
cap(resource.RLIMIT_CORE, 0)
sys.argv = ["main.py"]
sys.path.insert(0, "/job")
main = types.ModuleType("__main__")
main.__file__ = "/job/main.py"
sys.modules["__main__"] = main
try:
    with open("/job/main.py", "rb") as file:
        tree = ast.parse(file.read(), "/job/main.py")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "/job/main.py", "exec"), main.__dict__)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "/job/main.py", "eval"), main.__dict__)
        if value is not None:
            print(repr(value))
except Exception as error:
    frames = error.__traceback__  # the program's frames only, as if it ran on its own
    while frames is not None and frames.tb_frame.f_code.co_filename != "/job/main.py":
        frames = frames.tb_next
    traceback.print_exception(type(error), error, frames)
    raise SystemExit(1)
"""


class _CappedReader:
    """Drains a pipe, keeping the first ``limit`` bytes (the writer never blocks)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.dropped = 0

    async def drain(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while chunk := await stream.read(65536):
            room = self.limit - len(self.data)
            self.data.extend(chunk[: max(room, 0)])
            self.dropped += max(len(chunk) - max(room, 0), 0)

    def freeze(self) -> None:
        """Keep what was read so far; anything later is only counted as dropped."""
        self.limit = len(self.data)

    def text(self) -> str:
        text = self.data.decode("utf-8", errors="replace")
        return text + (f"\n[{self.dropped} more bytes dropped]" if self.dropped else "")


class BwrapSandbox:
    """Runs Python programs under bubblewrap; one instance per tool-runner replica."""

    def __init__(
        self,
        options: CodeInterpreterOptions,
        bwrap: str | None = None,
        cgroups: RunCgroups | None = None,
        *,
        strict_network: bool = False,
    ) -> None:
        self.options = options
        self.bwrap = bwrap or shutil.which("bwrap")
        self.network = SandboxNetwork.for_mode(options.network, strict=strict_network)
        self.cgroups = cgroups or RunCgroups()

    def available(self) -> bool:
        return self.bwrap is not None and Path(self.options.python).exists()

    async def run(self, code: str, timeout_s: float) -> CodeRun:
        """Run ``code`` with a wall clock of ``timeout_s``; raise only when no sandbox exists."""
        if not self.available():
            raise SandboxUnavailableError("bubblewrap (bwrap) is not installed on this host")
        job = Path(tempfile.mkdtemp(prefix="gw-sandbox-"))
        try:
            uid = self._run_uid()
            self._write_job(job, code, timeout_s, uid)
            return await self._execute(job, timeout_s, uid)
        finally:
            shutil.rmtree(job, ignore_errors=True)

    def _run_uid(self) -> int:
        if os.geteuid() == 0:
            return self.options.uid_base + random.randrange(65536)
        return os.getuid()

    def _nproc_limit(self, uid: int) -> int:
        """RLIMIT_NPROC counts every process of the uid: add what the uid already runs."""
        if uid != os.getuid() or os.geteuid() == 0:
            return self.options.max_processes
        running = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owned(p, uid))
        return running + self.options.max_processes

    def _write_job(self, job: Path, code: str, timeout_s: float, uid: int) -> None:
        opts = self.options
        (job / "job").mkdir()
        (job / "job" / "main.py").write_text(code)
        (job / "job" / "launch.py").write_text(
            _LAUNCHER.format(
                memory=opts.memory_mb * 1024 * 1024,
                nproc=self._nproc_limit(uid),
                fsize=opts.tmp_mb * 1024 * 1024,
                cpu=int(timeout_s) + 2,
            )
        )
        etc = job / "etc"
        etc.mkdir()
        (etc / "passwd").write_text(f"sandbox:x:{uid}:{uid}:sandbox:/tmp:/bin/sh\n")
        (etc / "group").write_text(f"sandbox:x:{uid}:\n")
        (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
        (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files dns\n")
        (etc / "resolv.conf").write_text(self.network.resolv_conf())
        (etc / "ssl" / "certs").mkdir(parents=True)  # mount point for the CA bundle
        for path in job.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        job.chmod(0o755)

    def _argv(self, job: Path, extra: list[str]) -> list[str]:
        assert self.bwrap is not None
        opts = self.options
        argv = [self.bwrap, "--unshare-all", "--unshare-user", *self.network.bwrap_args()]
        argv += ["--die-with-parent", "--new-session", "--disable-userns", "--cap-drop", "ALL"]
        argv += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr", "--tmpfs", "/usr/local"]
        argv += _root_links()
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--size", str(opts.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        argv += ["--ro-bind", str(job / "etc"), "/etc", "--ro-bind", str(job / "job"), "/job"]
        if Path("/etc/ssl/certs").is_dir():
            argv += ["--ro-bind", "/etc/ssl/certs", "/etc/ssl/certs"]
        argv += ["--chdir", "/tmp", "--clearenv"]
        for key, value in _SANDBOX_ENV.items():
            argv += ["--setenv", key, value]
        argv += [*extra, "--", opts.python, "-u", "-I", "/job/launch.py"]
        return argv

    async def _start(
        self, job: Path, uid: int, sync: StartupSync, cgroup: RunCgroup | None
    ) -> asyncio.subprocess.Process:
        """Start bwrap, held at ``--block-fd`` until released; on failure nothing of the
        run (startup pipes, memory cgroup) is left behind, since ``_execute`` never gets
        a process whose ``finally`` would clean them up."""
        # preexec_fn, not user=/group=: Serve replicas run on uvloop, whose subprocess_exec
        # refuses those keywords ("unexpected kwargs") but runs a preexec_fn in the child.
        drop = _drop_to(uid) if os.geteuid() == 0 else None
        try:
            process = await asyncio.create_subprocess_exec(
                *self._argv(job, sync.bwrap_args()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=sync.child_fds(),
                # bwrap's own process stays inside the sandbox as its pid 1 and its
                # /proc/1/environ is readable from there: it must not inherit the
                # gateway's environment (``--clearenv`` only clears the program's).
                env=_BWRAP_ENV,
                preexec_fn=drop,
            )
        except BaseException:
            sync.close()
            if cgroup is not None:
                await cgroup.remove()
            raise
        sync.close_child_ends()
        return process

    async def _execute(self, job: Path, timeout_s: float, uid: int) -> CodeRun:
        """One run: start it, move it into its cgroup, release it, wait at most
        ``timeout_s``, then kill whatever is left and report what it printed."""
        cgroup = self.cgroups.create(self.options.run_memory_mb * 1024 * 1024)
        sync = StartupSync()
        process = await self._start(job, uid, sync, cgroup)
        out, err = _CappedReader(self.options.max_output_bytes), _CappedReader(8192)
        # The pipes are read until EOF even after a kill: a reader that stopped
        # would leave the pipe paused, and the exit of the process unobserved.
        reading = asyncio.gather(out.drain(process.stdout), err.drain(process.stderr))
        timed_out, seconds = False, 0.0
        try:
            async with asyncio.timeout(SETUP_TIMEOUT_S):
                sandbox_pid = await sync.sandbox_pid()
            if cgroup is not None and not _joined(cgroup, (process.pid, sandbox_pid)):
                await cgroup.remove()
                cgroup = None
            async with self.network.attached(sandbox_pid):
                sync.release()
                started = time.monotonic()
                try:
                    async with asyncio.timeout(timeout_s):
                        await asyncio.shield(reading)
                        await process.wait()
                except TimeoutError:
                    timed_out = True
                # Billed time: the program's wall clock, never more than its limit.
                seconds = min(time.monotonic() - started, timeout_s)
        finally:
            out.freeze()
            err.freeze()
            await _kill(process, reading)
            sync.close()  # after the kill: EOF on --block-fd would let bwrap start the program
            memory_killed = cgroup is not None and cgroup.oom_kills() > 0
            if cgroup is not None:
                await cgroup.remove()
        return CodeRun(
            stdout=out.text(),
            stderr=err.text(),
            exit_code=None if timed_out else process.returncode,
            timed_out=timed_out,
            seconds=seconds,
            memory_killed=memory_killed,
        )


_SANDBOX_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "MPLBACKEND": "Agg",
    "CUDA_VISIBLE_DEVICES": "",
}


_BWRAP_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _root_links() -> list[str]:
    """/bin, /lib... as on the host: symlinks into /usr (merged /usr) or read-only binds."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64"):
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    return args


def _drop_to(uid: int) -> Callable[[], None]:
    """Run in the forked child before exec: the run's own unprivileged uid, no groups."""

    def drop() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return drop


def _joined(cgroup: RunCgroup, pids: tuple[int, ...]) -> bool:
    """Move the run's processes in before the program exists: all it starts is inside."""
    try:
        for pid in pids:
            cgroup.add(pid)
    except OSError as err:
        logger.warning("could not move a sandbox into its memory cgroup (%s)", err)
        return False
    return True


def _owned(proc: Path, uid: int) -> bool:
    with contextlib.suppress(OSError):
        return proc.stat().st_uid == uid
    return False


async def _kill(process: asyncio.subprocess.Process, reading: asyncio.Future[Any]) -> None:
    """SIGKILL bwrap: ``--die-with-parent`` then ends the sandbox's pid 1 and all it ran.

    The pipes then reach EOF (no process of the run holds them any more), the
    readers finish, and only then does asyncio report the exit.
    """
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.shield(reading), timeout=5)
    reading.cancel()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(process.wait(), timeout=5)
