"""``.ci/run`` fails when the code sandbox's tools cannot be installed, instead of letting
the sandbox's security tests skip (issue 45, "The suite cannot skip what matters")."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from serve_app.config import REPO_ROOT


def _stub(folder: Path, name: str, body: str = "exit 0") -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _ci_run(tmp_path: Path, *present: str) -> subprocess.CompletedProcess[str]:
    """``.ci/run`` with only stubs and ``present`` on PATH: services up, apt-get failing,
    ``make`` recording that it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    for service in ("pg_isready", "redis-cli"):
        _stub(bin_dir, service)
    _stub(bin_dir, "apt-get", "exit 100")
    _stub(bin_dir, "make", f"echo make-ran > {tmp_path}/make.log")
    for tool in present:
        _stub(bin_dir, tool)
    return subprocess.run(
        [str(bin_dir / "bash"), str(REPO_ROOT / ".ci" / "run")],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("present", [(), ("bwrap",), ("slirp4netns",)])
def test_ci_fails_without_bubblewrap_or_slirp4netns(tmp_path: Path, present: tuple[str]) -> None:
    run = _ci_run(tmp_path, *present)
    assert run.returncode == 1, run.stdout + run.stderr
    missing = "slirp4netns" if present == ("bwrap",) else "bwrap"
    assert f"ci: {missing} is not installed" in run.stderr
    assert not (tmp_path / "make.log").exists()  # no test run that would skip them


def test_ci_runs_make_test_with_both(tmp_path: Path) -> None:
    run = _ci_run(tmp_path, "bwrap", "slirp4netns")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "make.log").read_text().strip() == "make-ran"
