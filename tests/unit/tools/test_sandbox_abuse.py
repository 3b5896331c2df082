"""More escape and exhaustion attempts against the code sandbox (issue 4,
docs/reference/common.md#limits).

Found by an audit: bwrap's own process is the sandbox's pid 1 and was readable
from inside; an output flood kept the run alive past its limit; a program
forking and filling memory in every child was bounded only per process; and the
slirp network setup raced bwrap's loopback setup. Real sandboxes; skipped where
bwrap is missing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from deployments.sandbox.bwrap import BwrapSandbox
from deployments.sandbox.cgroup import RunCgroups
from serve_app.contract.sandbox import CodeInterpreterOptions
from tests.fixtures.sandbox_host import missing_for_run_cgroup, missing_for_slirp

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")


def sandbox(**options: object) -> BwrapSandbox:
    return BwrapSandbox(CodeInterpreterOptions.model_validate({"network": "none", **options}))


async def test_pid_1_of_the_sandbox_carries_no_gateway_environment() -> None:
    """/proc/1 is bwrap itself: its environment must not be the gateway's."""
    code = """
for pid in ("1", "self"):
    raw = open(f"/proc/{pid}/environ", "rb").read()
    print(pid, sorted(v.split(b"=", 1)[0].decode() for v in raw.split(b"\\0") if v))
"""
    run = await sandbox().run(code, 5)
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert set(eval(lines["1"])) <= {"PATH", "LANG"}, run.stdout
    assert "GATEWAY" not in run.stdout and "PYTEST" not in run.stdout
    for name, value in os.environ.items():  # nothing of this process, by value either
        if len(value) >= 12 and name not in ("PATH", "LANG"):
            assert value not in run.stdout


async def test_an_output_flood_ends_at_the_time_limit() -> None:
    # The kill once went unobserved (limit + 5 s): the run must end as timed out, and a hang
    # fails the guard; no window of the machine's speed is asserted.
    run = await asyncio.wait_for(
        sandbox(max_output_bytes=4096).run(
            "import sys\nwhile True:\n    sys.stdout.write('a' * 65536)", 1.5
        ),
        60.0,
    )
    assert run.timed_out and len(run.stdout) < 4200 and "more bytes dropped" in run.stdout


async def test_killing_pid_1_or_everything_only_ends_the_run() -> None:
    code = """
import os, signal
for target in (1, -1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError as err:
        print(target, type(err).__name__)
print("still here", flush=True)
"""
    run = await sandbox().run(code, 5)
    assert run.exit_code is not None and not run.timed_out  # a finished, completed run


_NO_RUN_CGROUP = missing_for_run_cgroup()
_NO_SLIRP = missing_for_slirp()


@pytest.mark.skipif(_NO_RUN_CGROUP is not None, reason=f"needs: {_NO_RUN_CGROUP}")
async def test_forking_memory_bomb_is_bounded_for_the_whole_run() -> None:
    """Each child stays under the per-process limit; together they pass the run's cap."""
    code = """
import os, time
children = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (60 * 1024 * 1024)
        time.sleep(2)
        os._exit(0)
    children.append(pid)
print([os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children], flush=True)
"""
    run = await sandbox(memory_mb=256, run_memory_mb=128).run(code, 10)
    statuses = eval(run.stdout.strip())
    assert -9 in statuses  # the kernel killed children inside the run, nothing outside
    assert run.memory_killed and "memory limit" in run.text_for_model()
    leftovers = [p for p in Path("/sys/fs/cgroup").rglob("gw-sandbox-*") if p.is_dir()]
    assert leftovers == []


def test_run_cgroups_on_a_delegated_v2_tree(tmp_path: Path) -> None:
    """Layout detection and limits, on a fake cgroup v2 root (the gateway's path is /)."""
    if not any(line.startswith("0::/") for line in Path("/proc/self/cgroup").read_text().split()):
        pytest.skip("this process has no cgroup v2 entry")
    own = Path("/proc/self/cgroup").read_text().split("0::", 1)[1].split()[0]
    parent = tmp_path / own.lstrip("/")
    parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    cgroups = RunCgroups(root=tmp_path)
    assert cgroups.create(1 << 20) is None  # memory not delegated below the gateway
    (parent / "cgroup.subtree_control").write_text("memory\n")
    group = RunCgroups(root=tmp_path).create(1 << 20)
    assert group is not None and group.path.parent == parent
    assert (group.path / "memory.max").read_text() == str(1 << 20)
    assert (group.path / "memory.swap.max").read_text() == "0"
    (group.path / "memory.events").write_text("low 0\noom 1\noom_kill 2\n")
    assert group.oom_kills() == 2


@pytest.mark.skipif(_NO_SLIRP is not None, reason=f"needs: {_NO_SLIRP}")
async def test_slirp_setup_never_races_the_sandbox_loopback() -> None:
    """slirp4netns and bwrap both configure ``lo``; run after run must all start."""
    box = sandbox(network="slirp")
    for _ in range(30):
        run = await box.run("print('up')", 5)
        assert run.stdout == "up\n"
