"""The skip budget: every skip is printed; a skip outside the allow-list fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from serve_app.config import REPO_ROOT
from tests.fixtures.skip_budget import Allowed, read_allowlist, unallowed

SUITE = """
import pytest

def test_runs():
    assert True

def test_gpu_only():
    pytest.skip("no CUDA here")

@pytest.mark.skipif(True, reason="slirp4netns missing")
def test_network_isolation():
    pass

@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.fixtures.skip_budget", "-p",
         "no:cacheprovider", "test_suite.py", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip


def test_without_a_list_every_skip_is_printed_and_the_run_passes(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert run.returncode == 0, run.stdout
    assert "skipped: test_suite.py::test_gpu_only: no CUDA here" in run.stdout
    assert "skipped: test_suite.py::test_network_isolation: slirp4netns missing" in run.stdout
    assert "test_expected_failure" not in run.stdout.split("skipped tests")[-1]


def test_a_skip_outside_the_list_fails_the_run(tmp_path: Path) -> None:
    allow = tmp_path / "allow.txt"
    allow.write_text("# header\ntest_suite.py::test_gpu_only  # GPU-only\n")
    run = _run(tmp_path, f"--skip-allowlist={allow}")
    assert run.returncode == 1, run.stdout
    assert "NOT ALLOWED: test_suite.py::test_network_isolation: slirp4netns missing" in run.stdout
    assert "skipped: test_suite.py::test_gpu_only: no CUDA here" in run.stdout
    assert "1 test(s) skipped outside" in run.stdout
    allow.write_text("test_suite.py::test_*  # all of them\n")
    assert _run(tmp_path, f"--skip-allowlist={allow}").returncode == 0


def test_an_entry_without_a_reason_is_refused(tmp_path: Path) -> None:
    allow = tmp_path / "allow.txt"
    allow.write_text("test_suite.py::test_gpu_only\n")
    with pytest.raises(ValueError, match="reason"):
        read_allowlist(allow)
    run = _run(tmp_path, f"--skip-allowlist={allow}")
    assert run.returncode != 0 and "reason" in run.stderr


def test_the_shipped_list_names_real_tests_with_reasons() -> None:
    entries = read_allowlist(REPO_ROOT / "tests" / "skip_allowlist.txt")
    assert entries and all(e.reason for e in entries)
    for entry in entries:
        path = entry.pattern.split("::")[0]
        assert (REPO_ROOT / path).is_file(), entry.pattern
    # what must never be allowed to skip: the sandbox's security tests, the fault suite
    for node in (
        "tests/unit/tools/test_sandbox.py::test_slirp_network_refuses_host_loopback_and_private_ranges",
        "tests/unit/tools/test_sandbox_abuse.py::test_forking_memory_bomb_is_bounded_for_the_whole_run",
        "tests/faults/test_outages.py::test_x",
        "tests/unit/chat/test_vllm_engine.py",
    ):
        assert unallowed({node: "why"}, entries) == {node: "why"}
    assert unallowed({"a::b": "r"}, [Allowed("a::*", "ok")]) == {}


def test_a_sandbox_test_skip_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fixtures import sandbox_host

    monkeypatch.setattr(sandbox_host.shutil, "which", lambda tool: None)
    monkeypatch.setattr(sandbox_host.os, "geteuid", lambda: 1000)
    missing = sandbox_host.missing_for_slirp()
    assert missing is not None
    assert "bwrap is not on PATH (apt-get install bubblewrap)" in missing
    assert "slirp4netns is not on PATH (apt-get install slirp4netns)" in missing
    assert "not root (euid 1000)" in missing
    assert "not root (euid 1000)" in (sandbox_host.missing_for_run_cgroup() or "")
