"""Peak memory of the gateway replica finalizing a batch with a large output, on the real
embeddings head (issue 41, item 4: "a benchmark figure on the real one").

``gateway run`` with configs/local.yaml reduced to its all-minilm-l6-v2 pooling head (vLLM's
pooling runner on the packaged model, one replica pinned for the run, the engine settings of
``bench/embeddings_bench.py``) and the batch worker unthrottled for the run
(``yield_to_live`` off, no enqueued-token limit, ``--concurrency`` lines at once). One batch
of ``--lines`` ``/v1/embeddings`` lines, each embedding ``--inputs`` distinct short inputs
(float encoding: ~4.6 kB of JSON an input), runs through the one gateway replica, whose
worker then finalizes it (results read page by page, the output written to a temporary file
and streamed to the object store: ``serve_app/batches/finalize.py``).

This process samples the gateway replica's resident size (``ray::ServeReplica:...:Gateway``,
``/proc/<pid>/statm``) every 5 ms and polls the batch every 0.1 s. Figures, MiB: the
replica idle (the head answering, before the upload), at the last poll that saw the batch
``in_progress``, its peak while the lines ran, its peak from then to the first poll that saw
it ``completed`` (finalization; a little of the last lines' run may fall in this window,
never the other way round), and the peak while the output file is downloaded
(``GET /v1/files/{id}/content``, streamed). The figure the issue bounds is the finalizing
peak over idle (< 256 MiB for 200 MB of output).

    .venv/bin/python bench/batch_finalize_memory.py   # 350 lines x 128 inputs: ~210 MB
    .venv/bin/python bench/batch_finalize_memory.py --lines 20 --inputs 32   # smoke test

Figures go to bench/results/batch_finalize_memory-<time>.json. Every process started is
stopped on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import proc_cpu
from bench.common import free_port, host_facts
from bench.embeddings_bench import DEPLOYMENT, ENGINE, MODEL, SOURCE
from bench.gateway_stack import gateway_config, start_gateway, wait_gateway
from bench.servers import descendants, stop_tree

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
PAGE = 4096


def rss_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE
    except OSError:
        return None


class Sampler(threading.Thread):
    """The replica's resident size every ``interval_s``, with the time of each sample."""

    def __init__(self, pid: int, interval_s: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval_s):
            size = rss_of(self.pid)
            if size is not None:
                self.samples.append((time.monotonic(), size))

    def peak(self, start: float, end: float) -> int:
        inside = [size for at, size in self.samples if start <= at <= end]
        return max(inside) if inside else 0

    def at(self, moment: float) -> int:
        before = [size for at, size in self.samples if at <= moment]
        return before[-1] if before else 0


def batch_input(lines: int, inputs: int) -> bytes:
    """``lines`` embeddings requests, every input distinct (nothing answered from a cache)."""
    out = []
    for line in range(lines):
        texts = [f"w{line}x{i}" for i in range(inputs)]
        body = {"model": MODEL, "input": texts, "encoding_format": "float"}
        request = {"custom_id": f"l{line}", "method": "POST", "url": "/v1/embeddings"}
        out.append(json.dumps({**request, "body": body}))
    return ("\n".join(out) + "\n").encode()


def gateway_replica(root_pid: int) -> int:
    found = [p.pid for p in proc_cpu.classify(root_pid, "gateway") if p.role == "gateway"]
    if len(found) != 1:
        raise RuntimeError(f"expected one gateway replica process, found {found}")
    return found[0]


def run_batch(http: httpx.Client, sampler: Sampler, args: argparse.Namespace) -> dict[str, Any]:
    """Idle figure, then the batch through to its output file; the figures of each phase."""
    time.sleep(2.0)
    idle_start = time.monotonic()
    time.sleep(3.0)
    idle = sampler.peak(idle_start, time.monotonic())
    data = batch_input(args.lines, args.inputs)
    progress(f"uploading {len(data) / MIB:.1f} MiB: {args.lines} lines x {args.inputs} inputs")
    uploaded = http.post(
        "/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}
    ).raise_for_status()
    body = {
        "input_file_id": uploaded.json()["id"],
        "endpoint": "/v1/embeddings",
        "completion_window": "24h",
    }
    created = http.post("/v1/batches", json=body).raise_for_status().json()
    started = time.monotonic()
    last_in_progress = started
    status = created["status"]
    batch = created
    deadline = started + args.batch_timeout_s
    while status not in ("completed", "failed", "expired", "cancelled"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch still {status} after {args.batch_timeout_s:.0f} s")
        time.sleep(0.1)
        batch = http.get(f"/v1/batches/{created['id']}").raise_for_status().json()
        if batch["status"] != status:
            progress(f"batch {batch['status']} at {time.monotonic() - started:.1f} s")
        status = batch["status"]
        if status in ("validating", "in_progress"):
            last_in_progress = time.monotonic()
    completed = time.monotonic()
    if status != "completed":
        raise RuntimeError(f"batch ended {status}: {batch}")
    time.sleep(1.0)
    download_start = time.monotonic()
    size = lines = 0
    with http.stream("GET", f"/v1/files/{batch['output_file_id']}/content") as answer:
        answer.raise_for_status()
        for chunk in answer.iter_bytes():
            size += len(chunk)
            lines += chunk.count(b"\n")
    download_end = time.monotonic()
    time.sleep(1.0)
    finalizing_peak = sampler.peak(last_in_progress, completed)
    return {
        "request_counts": batch["request_counts"],
        "output_bytes": size,
        "output_lines": lines,
        "run_s": round(last_in_progress - started, 1),
        "finalize_window_s": round(completed - last_in_progress, 2),
        "download_s": round(download_end - download_start, 2),
        "rss_mib": {
            "idle": mib(idle),
            "at_finalize_start": mib(sampler.at(last_in_progress)),
            "peak_running_lines": mib(sampler.peak(started, last_in_progress)),
            "peak_finalizing": mib(finalizing_peak),
            "peak_downloading": mib(sampler.peak(download_start, download_end)),
            "after": mib(sampler.at(time.monotonic())),
        },
        "finalizing_peak_over_idle_mib": mib(finalizing_peak - idle),
    }


def mib(size: int) -> float:
    return round(size / MIB, 1)


def progress(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--lines", type=int, default=350, help="batch lines (350: ~210 MB)")
    parser.add_argument("--inputs", type=int, default=128, help="inputs a line (128)")
    parser.add_argument("--concurrency", type=int, default=4, help="lines run at once (4)")
    parser.add_argument("--batch-timeout-s", type=float, default=600.0)
    parser.add_argument("--start-timeout-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--keep-logs", action="store_true")
    return parser.parse_args(argv)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    from deployments.local_models.resolve import resolve_model

    started = time.strftime("%Y-%m-%dT%H-%M-%S")
    model_path = Path(resolve_model(SOURCE))
    work = Path(tempfile.mkdtemp(prefix="finalizebench-"))
    progress(f"model {model_path}; logs and state in {work}")
    batches = {
        "yield_to_live": False,
        "max_enqueued_tokens_per_org": None,
        "concurrency": args.concurrency,
        "poll_interval_s": 0.2,
    }
    config = gateway_config(
        work / "gateway.yaml",
        {"batches": batches},
        model=MODEL,
        head="pooling",
        engine=ENGINE,
        deployment=DEPLOYMENT,
    )
    probe = ("/v1/embeddings", {"model": MODEL, "input": "warm up"})
    gateway = None
    seen: list[Any] = []
    try:
        port = free_port()
        gateway, key = start_gateway(config, port, work, model_path.parent, ["--no-dashboard"])
        url = f"http://127.0.0.1:{port}"
        wait_gateway(url, key, gateway, work / "gateway.log", args.start_timeout_s, probe)
        seen = descendants(gateway.pid)
        sampler = Sampler(gateway_replica(gateway.pid))
        sampler.start()
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=300) as http:
            figures = run_batch(http, sampler, args)
        sampler.done.set()
    except KeyboardInterrupt:
        print(f"interrupted; logs in {work}", file=sys.stderr)
        return 130
    finally:
        progress("stopping the stack")
        if gateway is not None:
            stop_tree(gateway, signal.SIGINT, 60.0, seen)
    result = {
        "started": started,
        "config": {
            "model": MODEL,
            "source": SOURCE,
            "engine": ENGINE,
            "lines": args.lines,
            "inputs": args.inputs,
            "batches": batches,
            "command": " ".join(sys.argv),
        },
        "host": host_facts(),
        **figures,
    }
    print(json.dumps(result, indent=2))
    if not args.keep_logs:
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"batch_finalize_memory-{started}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
