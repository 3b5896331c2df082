"""What an idle ``gateway run`` costs: CPU per process and per thread, nothing to serve.

Starts ``gateway run`` on the SmolLM2-only config ``vs_vllm.py`` uses, sends a few
calls (pollers that start on first use are then running, as on a server that has
served), waits for vLLM's post-call spin to end, then reads /proc over
``--seconds``. ``--gateway-args`` and ``--env`` compare settings, one run each:

    .venv/bin/python bench/idle_cpu.py --seconds 20
    .venv/bin/python bench/idle_cpu.py --env RAY_SERVE_CONTROL_LOOP_INTERVAL_S=1
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import proc_cpu
from bench.common import free_port
from bench.gateway_stack import MODEL, gateway_config, start_gateway, wait_gateway
from bench.servers import descendants, stop_tree


def measure(root: int, seconds: float) -> dict[str, Any]:
    procs = proc_cpu.classify(root, "gateway")
    before = {p.pid: proc_cpu.threads(p.pid) for p in procs}
    start = time.perf_counter()
    time.sleep(seconds)
    after = {p.pid: proc_cpu.threads(p.pid) for p in procs}
    elapsed = time.perf_counter() - start
    rows, thread_rows = [], []
    for p in procs:
        spent = 0.0
        for tid, (name, end) in after.get(p.pid, {}).items():
            began = before.get(p.pid, {}).get(tid, (name, 0.0))[1]
            spent += end - began
            if end - began > 0:
                thread_rows.append((round((end - began) / elapsed, 4), p.name[:40], name))
        rows.append((round(spent / elapsed, 4), p.role, p.name))
    rows.sort(reverse=True)
    thread_rows.sort(reverse=True)
    return {
        "seconds": round(elapsed, 1),
        "total_core_share": round(sum(r[0] for r in rows), 4),
        "by_process": [{"core_share": s, "role": r, "process": n} for s, r, n in rows if s],
        "by_thread": [{"core_share": s, "process": p, "thread": t} for s, p, t in thread_rows],
    }


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so the finally below stops the stack


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="idle window")
    parser.add_argument("--calls", type=int, default=3, help="calls before the window")
    parser.add_argument("--gateway-args", default="", help="extra `gateway run` options")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the stack")
    parser.add_argument(
        "--app-args",
        type=json.loads,
        default={},
        help="JSON merged into the application args, e.g. '{\"readiness_refresh_s\": 10}'",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="serve this config as it is instead (e.g. configs/local.yaml: every head)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupted)
    from deployments.local_models.prepared_models import ensure_model

    model_path = ensure_model(MODEL)
    work = Path(tempfile.mkdtemp(prefix="idlecpu-"))
    os.environ.update(dict(item.split("=", 1) for item in args.env))
    port = free_port()
    proc, key = start_gateway(
        args.config.resolve() if args.config else gateway_config(work / "g.yaml", args.app_args),
        port,
        work,
        model_path.parent,
        shlex.split(args.gateway_args),
    )
    seen: list[psutil.Process] = []
    try:
        url = f"http://127.0.0.1:{port}"
        wait_gateway(url, key, proc, work / "gateway.log", args.start_timeout_s)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        for _ in range(args.calls):
            httpx.post(
                f"{url}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=120,
            ).raise_for_status()
        time.sleep(5)  # vLLM's workers spin for a second after each call
        seen = descendants(proc.pid)
        result = measure(proc.pid, args.seconds)
    finally:
        stop_tree(proc, signal.SIGINT, 60.0, seen)
    result["env"], result["gateway_args"] = args.env, args.gateway_args
    result["app_args"] = args.app_args
    print(f"idle gateway run, {result['seconds']} s: {result['total_core_share']:.3f} of a core")
    print(f"  env {args.env or '-'}; gateway args {args.gateway_args or '-'}")
    print(f"  app args {json.dumps(args.app_args) if args.app_args else '-'}")
    for row in result["by_process"]:
        print(f"  {row['core_share']:.3f}  {row['role']:<17} {row['process']}")
    print("threads (> 0):")
    for row in result["by_thread"][:25]:
        print(f"  {row['core_share']:.3f}  {row['process']:<40} {row['thread']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
