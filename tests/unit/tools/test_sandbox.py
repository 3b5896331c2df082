"""The code_interpreter sandbox under abuse (docs/reference/common.md#limits; issue 4: escape
attempts fail safely).

These run real bubblewrap sandboxes; they are skipped where bwrap is missing.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.sandbox.bwrap import BwrapSandbox
from serve_app.contract.sandbox import CodeInterpreterOptions
from tests.fixtures.sandbox_host import missing_for_slirp

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")

REPO = Path(__file__).resolve().parents[3]
HANG_GUARD_S = 60.0
"""Only against a hang: far above any run's limit, so a slow machine cannot fail on it."""
SANDBOX_ENV_NAMES = {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "MPLBACKEND", "PWD"} | {
    "CUDA_VISIBLE_DEVICES"
}


def sandbox(**options: object) -> BwrapSandbox:
    return BwrapSandbox(CodeInterpreterOptions.model_validate({"network": "none", **options}))


async def test_a_program_runs_and_prints() -> None:
    run = await sandbox().run("print(sum(range(10)))", 5)
    assert run.stdout.strip() == "45"
    assert run.exit_code == 0 and not run.timed_out


async def test_a_final_expression_is_shown_like_in_a_notebook() -> None:
    run = await sandbox().run("print('first')\nx = 17\nx * 23", 5)
    assert run.stdout == "first\n391\n" and run.exit_code == 0
    for code in ("print('once')", "x = 1", "None", ""):  # no value, nothing more printed
        run = await sandbox().run(code, 5)
        assert run.stdout == ("once\n" if "print" in code else ""), code
    # The program still runs as __main__ (pickle and dataclasses look it up there).
    code = (
        "import pickle\nfrom dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\n"
        "if __name__ == '__main__':\n    pickle.loads(pickle.dumps(P(3)))"
    )
    run = await sandbox().run(code + "\nP(3)", 5)
    assert run.stdout == "P(x=3)\n", run.stderr


async def test_errors_show_only_the_programs_own_traceback() -> None:
    run = await sandbox().run("x = 1\nx / 0", 5)
    assert run.exit_code == 1 and run.stdout == ""
    assert run.stderr.startswith(
        'Traceback (most recent call last):\n  File "/job/main.py", line 2'
    )
    assert run.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "launch.py" not in run.stderr
    run = await sandbox().run("def f(:\n    pass", 5)
    assert run.exit_code == 1
    assert run.stderr.startswith('  File "/job/main.py", line 1') and "SyntaxError" in run.stderr
    run = await sandbox().run("import sys\nprint('bye')\nsys.exit(3)", 5)
    assert (run.exit_code, run.stdout, run.stderr) == (3, "bye\n", "")


async def test_no_host_files_environment_or_gpu() -> None:
    code = f"""
import asyncio
import asyncio
import os
print(sorted(os.listdir("/")))
for path in ["/etc/hostname", "/etc/shadow", {str(REPO / "pyproject.toml")!r}, "/root", "/work"]:
    print(path, os.path.exists(path))
print("env", sorted(os.environ))
print("gpu", [d for d in os.listdir("/dev") if d.startswith("nvidia")])
"""
    run = await sandbox().run(code, 5)
    lines = run.stdout.splitlines()
    names = set(eval(lines[6].removeprefix("env ")))
    assert names <= SANDBOX_ENV_NAMES  # nothing of the gateway's environment
    assert set(eval(lines[0])) <= {
        "bin",
        "dev",
        "etc",
        "job",
        "lib",
        "lib64",
        "proc",
        "sbin",
        "tmp",
        "usr",
    }
    for line in lines[1:6]:
        assert line.endswith("False"), line
    assert "gpu []" in run.stdout


async def test_reading_a_host_file_fails() -> None:
    hostname = Path("/etc/hostname")
    run = await sandbox().run(f"print(open({str(REPO / 'README.md')!r}).read())", 5)
    assert run.exit_code != 0 and "FileNotFoundError" in run.stderr
    if hostname.exists() and hostname.read_text().strip():
        run = await sandbox().run("print(open('/etc/hostname').read())", 5)
        assert hostname.read_text().strip() not in run.stdout


async def test_runaway_loop_is_killed_at_the_timeout_with_its_output() -> None:
    started = time.monotonic()
    # HANG_GUARD_S: a kill that is never observed hangs; no machine-speed window is asserted.
    run = await asyncio.wait_for(
        sandbox().run("print('working', flush=True)\nwhile True:\n    pass", 1.5), HANG_GUARD_S
    )
    assert run.timed_out and run.exit_code is None
    assert run.stdout == "working\n"
    assert time.monotonic() - started >= 1.4  # never before its limit, however fast the box


async def test_long_sleep_in_a_child_process_does_not_outlive_the_run() -> None:
    code = "import subprocess\nsubprocess.Popen(['sleep', '60'])\nprint('spawned')"
    run = await asyncio.wait_for(sandbox().run(code, 5), HANG_GUARD_S)
    assert run.stdout.strip() == "spawned"
    # The run ends with its main program: had the child kept it alive, the 5 s limit would
    # have ended it as timed out (an outcome, not a window of the machine's speed).
    assert not run.timed_out and run.exit_code == 0


async def test_fork_bomb_is_contained() -> None:
    code = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError as err:
    print("stopped after", n)
"""
    run = await sandbox(max_processes=16).run(code, 5)
    assert "stopped after" in run.stdout
    assert int(run.stdout.split()[-1]) <= 16


async def test_memory_bomb_fails_inside_the_sandbox() -> None:
    run = await sandbox(memory_mb=128).run("x = bytearray(1024 ** 3)\nprint('allocated')", 5)
    assert "MemoryError" in run.stderr and "allocated" not in run.stdout


async def test_tmp_is_size_capped() -> None:
    code = "open('/tmp/fill', 'wb').write(b'x' * (8 * 1024 * 1024))\nprint('wrote')"
    run = await sandbox(tmp_mb=2).run(code, 5)
    assert "wrote" not in run.stdout


async def test_output_is_capped() -> None:
    run = await sandbox(max_output_bytes=2048).run("print('y' * 100000)", 5)
    assert len(run.stdout) < 2200 and "more bytes dropped" in run.stdout


@pytest.fixture
def loopback_port() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


_NO_SLIRP = missing_for_slirp()


@pytest.mark.skipif(_NO_SLIRP is not None, reason=f"needs: {_NO_SLIRP}")
async def test_slirp_network_refuses_host_loopback_and_private_ranges(loopback_port: int) -> None:
    code = f"""
import socket
for host in ["127.0.0.1", "10.0.2.2", "192.168.1.1", "169.254.169.254", "172.16.0.1"]:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, {loopback_port}))
        print(host, "OPEN")
    except OSError as err:
        print(host, "blocked", err.errno)
"""
    run = await sandbox(network="slirp").run(code, 10)
    assert "OPEN" not in run.stdout
    assert run.stdout.count("blocked") == 5


async def test_no_network_mode_has_no_route_out(loopback_port: int) -> None:
    code = f"""
import socket
s = socket.socket()
s.settimeout(2)
try:
    s.connect(("127.0.0.1", {loopback_port}))
    print("OPEN")
except OSError:
    print("blocked")
"""
    run = await sandbox().run(code, 5)
    assert run.stdout.strip() == "blocked"
