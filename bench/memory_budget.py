"""Memory of ``gateway run``: boot peak, idle, per head, each sleeping head woken, OOM kills.

Starts ``gateway run`` on CONFIG (default: what ``make run`` serves) in a fresh state
folder that shares the models cache, samples every second the proportional set size
(PSS) of its whole process tree (Ray's daemons, every replica, every vLLM engine
process) and the machine's used memory (``free``'s "used"), and prints:

* the time to the first SmolLM2 answer and the stack's peak during boot;
* the stack idle after ``--idle-s`` seconds, with a table per head (a replica and the
  engine processes under it), Ray's own processes and ``gateway run``;
* with ``--wake``, each sleeping head woken by a chat call (503 ``model_warming`` is
  retried): its wake time and its cost once awake;
* how many workers Ray's memory monitor killed (raylet log).

    .venv/bin/python bench/memory_budget.py                  # boot + idle
    .venv/bin/python bench/memory_budget.py --wake --idle-s 30

PSS counts shared pages once across the tree, so the stack total is what it costs
the machine; "used" also moves with anything else running on the box.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import free_port  # noqa: E402
from bench.servers import descendants, mint_key  # noqa: E402

GiB = 1024**3
FIRST_MODEL = "smollm2-135m-instruct"
REPLICA_TITLE = re.compile(r"ray::ServeReplica:([^:\s]+):(\S+)")


def pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid`` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def machine_used() -> int:
    """``free``'s "used": total - free - buffers - cache."""
    return int(psutil.virtual_memory().used)


def _title(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline()) or process.name()
    except psutil.Error:
        return ""


def group_of(process: psutil.Process, root_pid: int, titles: dict[int, str]) -> str:
    """The head (deployment) a process belongs to, or what else it is."""
    chain = [process]
    with contextlib.suppress(psutil.Error):
        chain += process.parents()
    for p in chain:
        match = REPLICA_TITLE.search(titles.get(p.pid, ""))
        if match:
            return match.group(2)
    if process.pid == root_pid:
        return "gateway run (driver)"
    if "VLLM" in titles.get(process.pid, "") or "prepare" in titles.get(process.pid, ""):
        return "model preparation"
    return "ray (daemons, proxy, controller, idle workers)"


@dataclass
class Sampler:
    """Samples the stack's PSS and the machine's used memory every ``period_s``."""

    root_pid: int
    period_s: float = 1.0
    peak_stack: int = 0
    peak_used: int = 0
    last_groups: dict[str, int] = field(default_factory=dict)
    peak_groups: dict[str, int] = field(default_factory=dict)
    """The groups at the stack's peak, and when it was (seconds after ``start``)."""
    peak_at: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def snapshot(self) -> dict[str, int]:
        processes = descendants(self.root_pid)
        titles = {p.pid: _title(p) for p in processes}
        groups: dict[str, int] = defaultdict(int)
        for p in processes:
            groups[group_of(p, self.root_pid, titles)] += pss_bytes(p.pid)
        return dict(groups)

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(self.period_s):
            groups = self.snapshot()
            self.last_groups = groups
            total = sum(groups.values())
            if total > self.peak_stack:
                self.peak_stack, self.peak_groups = total, groups
                self.peak_at = time.monotonic() - started
            self.peak_used = max(self.peak_used, machine_used())


def chat(base: str, key: str, model: str, deadline_s: float) -> float:
    """Seconds until ``model`` answers a short chat; 503 model_warming is retried."""
    started = time.monotonic()
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as http:
        while time.monotonic() - started < deadline_s:
            try:
                resp = http.post("/v1/chat/completions", json=body, timeout=300)
            except httpx.HTTPError:
                time.sleep(1)
                continue
            if resp.status_code == 200:
                return time.monotonic() - started
            if resp.status_code not in (503, 404):
                raise SystemExit(f"{model}: {resp.status_code} {resp.text[:300]}")
            time.sleep(min(float(resp.headers.get("retry-after", "2")), 5.0))
    raise SystemExit(f"{model} did not answer within {deadline_s:.0f} s")


def oom_kills(since: float) -> int:
    """Workers Ray's memory monitor killed in sessions started after ``since``."""
    count = 0
    for session in Path("/tmp/ray").glob("session_2*"):
        if session.stat().st_mtime < since:
            continue
        for log in session.glob("logs/raylet*.out"):
            count += log.read_text(errors="replace").count("Killing worker")
    return count


def table(groups: dict[str, int]) -> str:
    rows = sorted(groups.items(), key=lambda kv: -kv[1])
    lines = [f"    {name:<52} {value / GiB:6.2f} GiB" for name, value in rows]
    lines.append(f"    {'total':<52} {sum(groups.values()) / GiB:6.2f} GiB")
    return "\n".join(lines)


def sleeping_chat_models(config: str) -> list[tuple[str, str]]:
    """Chat models of CONFIG whose heads autoscale to zero (they sleep when idle)."""
    from serve_app.cli.serve import _catalog_models, load_serve_config

    models = _catalog_models(load_serve_config(config))
    return [
        (m.id, m.deployment_name())
        for m in models
        if m.head == "chat"
        and not m.is_external
        and (m.deployment.autoscaling_config or {}).get("min_replicas", 1) == 0
    ]


def start_gateway_run(config: str, state: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``gateway run`` on ``config`` in its own session, with ``state`` as its state folder
    (log in ``state/gateway-run.log``) and the shared models cache; (process, base URL).

    This process takes the same ``GATEWAY_*`` folders, so a key it mints is the stack's.
    """
    from serve_app.contract.paths import models_dir_from_environment

    folders = {
        "GATEWAY_STATE_DIR": str(state),
        "GATEWAY_MODELS_DIR": str(models_dir_from_environment()),
    }
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "serve_app.cli", "run", "--config", config, "--port", str(port)],
        cwd=REPO,
        env={**os.environ, **folders},
        stdout=(state / "gateway-run.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    os.environ.update(folders)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    """Until ``gateway run`` says the gateway is ready; exits when it died or took too long."""
    deadline = time.monotonic() + timeout_s
    while b"] gateway ready on" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"gateway run did not come up; see {log}")
        time.sleep(0.5)


def stop_gateway_run(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C (its clean stop), then SIGKILL after a minute."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/local.yaml")
    parser.add_argument("--idle-s", type=float, default=60.0, help="idle time before reading")
    parser.add_argument("--wake", action="store_true", help="wake each sleeping chat head")
    parser.add_argument("--boot-timeout-s", type=float, default=900.0)
    args = parser.parse_args()

    state = Path(tempfile.mkdtemp(prefix="memory-budget-"))
    launched = time.monotonic()
    wall_start = time.time()
    used_before = machine_used()
    proc, base = start_gateway_run(args.config, state)
    sampler = Sampler(proc.pid)
    sampler.start()
    try:
        wait_ready(proc, state / "gateway-run.log", args.boot_timeout_s)
        key = mint_key(f"sqlite:///{state / 'gateway.db'}")
        chat(base, key, FIRST_MODEL, args.boot_timeout_s)
        first = time.monotonic() - launched
        boot_peak_stack, boot_peak_used = sampler.peak_stack, sampler.peak_used
        print(f"first {FIRST_MODEL} answer {first:.0f} s after launch", flush=True)
        print(
            f"boot peak: stack {boot_peak_stack / GiB:.2f} GiB PSS, machine used "
            f"{boot_peak_used / GiB:.2f} GiB (before launch {used_before / GiB:.2f})",
            flush=True,
        )
        time.sleep(args.idle_s)
        idle = sampler.snapshot()
        print(f"idle after {args.idle_s:.0f} s (machine used {machine_used() / GiB:.2f} GiB):")
        print(table(idle), flush=True)
        if args.wake:
            for model, deployment in sleeping_chat_models(args.config):
                before = sum(sampler.snapshot().values())
                took = chat(base, key, model, args.boot_timeout_s)
                after = sampler.snapshot()
                grown = (sum(after.values()) - before) / GiB
                print(
                    f"woke {model} in {took:.0f} s: stack +{grown:.2f} GiB"
                    f" (its head {after.get(deployment, 0) / GiB:.2f} GiB)",
                    flush=True,
                )
            print("all awake:")
            print(table(sampler.snapshot()), flush=True)
        print(
            f"peak over the run: stack {sampler.peak_stack / GiB:.2f} GiB, machine used "
            f"{sampler.peak_used / GiB:.2f} GiB; Ray OOM kills: {oom_kills(wall_start)}"
        )
        print(f"gateway run log: {state / 'gateway-run.log'}")
    finally:
        sampler.stop()
        stop_gateway_run(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
