"""Where the gateway's per-token CPU goes: py-spy on the proxy, gateway and head replicas.

``bench/vs_vllm.py`` says how much CPU each process of the stack spends per 1,000
tokens; this says on what. It starts ``gateway run`` with the same SmolLM2-only
config as ``vs_vllm.py`` (no bare vLLM server), keeps ``--streams`` chat streams in
flight (each forced to ``--tokens`` tokens), and over a ``--seconds`` window:

- samples the Serve proxy, the gateway replica and the head replica with
  ``py-spy record --gil`` (speedscope files under ``--out``). Only samples that hold
  the GIL count: py-spy's idle detection does not work on this VM (threads blocked
  in ``select`` or in Ray's C++ loop show up as busy), and the GIL holder is the
  thread running Python;
- reads each process's and each thread's CPU time from /proc, so the CPU that
  py-spy cannot see (Ray's C++ core-worker threads) is still accounted for;
- prints CPU s per 1,000 tokens per role, the busiest threads, and per process
  the top frames: by self time (the leaf) and by inclusive time.

    flock /work/heavy.lock .venv/bin/python bench/profile_stream.py --streams 32
    flock /work/heavy.lock .venv/bin/python bench/profile_stream.py --no-profile \
        --env RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0

py-spy itself costs CPU on a small box: for CPU figures to compare with
``vs_vllm.py`` use ``--no-profile``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import proc_cpu
from bench.common import chat_once, free_port
from bench.gateway_stack import MODEL, gateway_config, start_gateway, wait_gateway
from bench.servers import descendants, stop_tree

REPO = Path(__file__).resolve().parent.parent
PROFILED = ("proxy", "gateway", "head")
PY_SPY = Path(sys.executable).with_name("py-spy")


class Tally:
    """Completion tokens and answers received so far (read at the window's edges)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.answers = 0


async def load(
    url: str, key: str, streams: int, tokens: int, stop: asyncio.Event, tally: Tally
) -> None:
    """``streams`` callers, each sending forced-length streams back to back until ``stop``.

    A stream's tokens are counted when it ends, so a window's count is off by at
    most the streams in flight at its edges (~1 answer each).
    """
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
    headers = {"Authorization": f"Bearer {key}"}
    extra = {"ignore_eos": True, "min_tokens": tokens}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, timeout=300
    ) as client:

        async def caller() -> None:
            while not stop.is_set():
                _, _, got = await chat_once(client, MODEL, tokens, True, extra)
                tally.tokens += got
                tally.answers += 1

        tasks = [asyncio.create_task(caller()) for _ in range(streams)]
        await stop.wait()
        await asyncio.gather(*tasks)


class Window:
    """Tokens and CPU between ``open`` and ``close`` (counted by the caller tasks)."""

    def __init__(self, procs: list[proc_cpu.Proc]) -> None:
        self.procs = procs
        self.before: dict[int, float] = {}
        self.threads_before: dict[int, dict[int, tuple[str, float]]] = {}

    def open(self) -> None:
        self.before = proc_cpu.snapshot(self.procs)
        self.threads_before = {p.pid: proc_cpu.threads(p.pid) for p in self.procs}

    def close(self) -> tuple[dict[str, float], dict[str, list[tuple[str, float]]]]:
        after = proc_cpu.snapshot(self.procs)
        roles = proc_cpu.by_role(self.procs, self.before, after)
        busiest: dict[str, list[tuple[str, float]]] = {}
        for p in self.procs:
            if p.role not in PROFILED:
                continue
            now = proc_cpu.threads(p.pid)
            spent: dict[str, float] = {}
            for tid, (name, seconds) in now.items():
                was = self.threads_before.get(p.pid, {}).get(tid, (name, 0.0))[1]
                spent[f"{tid}:{name}"] = seconds - was
            ranked = sorted(spent.items(), key=lambda kv: -kv[1])[:8]
            busiest[p.role] = [(n, round(s, 2)) for n, s in ranked if s > 0]
        return roles, busiest


def top_frames(speedscope: Path, limit: int) -> dict[str, Any]:
    """Self and inclusive shares of samples per frame, from a py-spy speedscope file.

    Every thread's samples count (py-spy leaves idle threads out), so the shares
    are of the process's busy Python time.
    """
    data = json.loads(speedscope.read_text())
    names = [
        f"{f['name']} ({Path(f.get('file') or '?').name}:{f.get('line', '?')})"
        for f in data["shared"]["frames"]
    ]
    self_n: collections.Counter[str] = collections.Counter()
    incl_n: collections.Counter[str] = collections.Counter()
    total = 0.0
    for profile in data["profiles"]:
        for stack, weight in zip(profile["samples"], profile["weights"], strict=True):
            if not stack:
                continue
            total += weight
            self_n[names[stack[-1]]] += weight
            for frame in {names[i] for i in stack}:
                incl_n[frame] += weight
    threads = {p["name"]: round(sum(p["weights"]), 2) for p in data["profiles"]}
    if not total:
        return {"samples": 0, "self": [], "inclusive": [], "threads": threads}
    return {
        "samples": total,
        "threads": threads,
        "self": [(f, round(100 * n / total, 1)) for f, n in self_n.most_common(limit)],
        "inclusive": [(f, round(100 * n / total, 1)) for f, n in incl_n.most_common(limit)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--warmup-s", type=float, default=15.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=50, help="py-spy samples per second")
    parser.add_argument("--no-profile", action="store_true", help="CPU figures only")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for gateway run")
    parser.add_argument("--gateway-args", default="")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "profile")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    args = parser.parse_args(argv)

    from deployments.local_models.prepared_models import ensure_model

    model_path = ensure_model(MODEL)
    work = Path(tempfile.mkdtemp(prefix="profile-"))
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S")
    out = args.out / stamp
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    saved_env = dict(os.environ)
    os.environ.update(dict(item.split("=", 1) for item in args.env))
    config = gateway_config(work / "gateway.yaml")
    gateway, key = start_gateway(
        config, port, work, model_path.parent, shlex.split(args.gateway_args)
    )
    os.environ.clear()
    os.environ.update(saved_env)
    seen = []
    result: dict[str, Any] = {"started": stamp, "args": {**vars(args), "out": str(args.out)}}
    try:
        url = f"http://127.0.0.1:{port}"
        wait_gateway(url, key, gateway, work / "gateway.log", args.start_timeout_s)
        seen = descendants(gateway.pid)
        procs = proc_cpu.classify(gateway.pid, "gateway")
        targets = {p.role: p.pid for p in procs if p.role in PROFILED}
        print(f"==> profiling {targets}", file=sys.stderr, flush=True)
        result.update(asyncio.run(measure(url, key, procs, targets, args, out)))
    finally:
        stop_tree(gateway, signal.SIGINT, 60.0, seen)
        shutil.rmtree(work, ignore_errors=True)
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    report(result)
    print(f"\nwrote {out}/", file=sys.stderr)
    return 0


async def measure(
    url: str,
    key: str,
    procs: list[proc_cpu.Proc],
    targets: dict[str, int],
    args: argparse.Namespace,
    out: Path,
) -> dict[str, Any]:
    stop = asyncio.Event()
    tally = Tally()
    counter = asyncio.create_task(load(url, key, args.streams, args.tokens, stop, tally))
    await asyncio.sleep(args.warmup_s)
    spies: list[subprocess.Popen[bytes]] = []
    if not args.no_profile:
        for role, pid in targets.items():
            cmd = [str(PY_SPY), "record", "-p", str(pid), "-d", str(int(args.seconds))]
            cmd += ["-r", str(args.rate), "-f", "speedscope", "--gil"]
            cmd += ["-o", str(out / f"{role}.speedscope.json")]
            spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
    window = Window(procs)
    tokens_before = tally.tokens
    window.open()
    started = time.perf_counter()
    await asyncio.sleep(args.seconds)
    roles, busiest = window.close()
    elapsed = time.perf_counter() - started
    tokens = tally.tokens - tokens_before
    stop.set()
    await counter
    for spy in spies:
        await asyncio.to_thread(spy.wait)
    frames = {}
    for role in targets:
        speedscope = out / f"{role}.speedscope.json"
        if speedscope.exists():
            frames[role] = top_frames(speedscope, args.top)
    per_1k = {r: round(s / tokens * 1000, 3) for r, s in sorted(roles.items())} if tokens else {}
    return {
        "window_s": round(elapsed, 1),
        "tokens": tokens,
        "tokens_per_s": round(tokens / elapsed, 1),
        "answers_total": tally.answers,
        "cpu_s_per_1k_tokens": per_1k,
        "core_share": {r: round(s / elapsed, 3) for r, s in sorted(roles.items())},
        "busiest_threads_cpu_s": busiest,
        "frames": frames,
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"\n{result['window_s']} s window: {result['tokens']} tokens, "
        f"{result['tokens_per_s']} tok/s"
    )
    print(
        "CPU s per 1,000 tokens: "
        + ", ".join(f"{r} {v:.3f}" for r, v in result["cpu_s_per_1k_tokens"].items())
    )
    print("core share: " + ", ".join(f"{r} {v:.3f}" for r, v in result["core_share"].items()))
    for role, rows in result["busiest_threads_cpu_s"].items():
        print(f"  {role} threads: " + ", ".join(f"{n} {s}" for n, s in rows))
    for role, frames in result["frames"].items():
        print(f"\n== {role}: GIL-holding seconds sampled per thread: {frames['threads']}")
        print(f"== {role}: top self frames (% of samples)")
        for frame, share in frames["self"]:
            print(f"  {share:5.1f}  {frame}")
        print(f"== {role}: top inclusive frames")
        for frame, share in frames["inclusive"]:
            print(f"  {share:5.1f}  {frame}")


if __name__ == "__main__":
    sys.exit(main())
