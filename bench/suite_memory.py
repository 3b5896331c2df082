"""Peak memory of a command's whole process tree: what the test suite costs the machine.

The machine has 24 GiB for everything, CI's test stack included, so the suite's own
peak is a budget to watch like its run time. This runs COMMAND (default: the
end-to-end suite), samples every ``--period-s`` the proportional set size (PSS) of its
process tree (pytest, the Ray daemons it starts, every replica and vLLM engine
process), grouped by head as ``memory_budget.py`` does, and prints at the end:

* the tree's peak PSS and the moment it happened, with the groups at that moment;
* the machine's peak "used" (this also moves with anything else on the box);
* how many workers Ray's memory monitor killed during the run (raylet logs);
* the command's exit status, which this script returns.

    .venv/bin/python bench/suite_memory.py                         # tests/serve
    .venv/bin/python bench/suite_memory.py -- make pytest          # what CI runs
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.memory_budget import GiB, Sampler, oom_kills, table  # noqa: E402

DEFAULT_COMMAND = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/serve"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--period-s", type=float, default=5.0, help="sampling period")
    parser.add_argument("command", nargs="*", help="the command (after --); default tests/serve")
    args = parser.parse_args()
    command = args.command or DEFAULT_COMMAND
    started_wall = time.time()
    started = time.monotonic()
    child = subprocess.Popen(command, cwd=REPO)
    sampler = Sampler(root_pid=child.pid, period_s=args.period_s)
    sampler.start()
    status = child.wait()
    sampler.stop()
    print(f"\n== {' '.join(command)}: exit {status} after {time.monotonic() - started:.0f} s")
    print(f"   tree peak PSS {sampler.peak_stack / GiB:.2f} GiB at +{sampler.peak_at:.0f} s:")
    print(table(sampler.peak_groups))
    print(f"   machine peak used {sampler.peak_used / GiB:.2f} GiB")
    print(f"   Ray OOM kills: {oom_kills(started_wall)}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
