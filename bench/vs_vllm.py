"""The gateway against vLLM's own OpenAI server, measured in one run, request by request.

Starts two stacks on the same prepared model folder (``prepared:smollm2-135m-instruct``)
with the same engine settings (float32, max_model_len 2048, max_num_seqs 16,
enforce_eager, 256 MiB KV cache):

- bare:    ``python -m vllm.entrypoints.openai.api_server``;
- gateway: ``gateway run`` with configs/local.yaml reduced to its SmolLM2 chat head
           (a temporary config: the other heads are not booted), an API key minted
           in a temporary database.

Then, on loopback ports chosen free:

1. sequential calls taken in turns (bare, gateway, bare, gateway...): non-streamed and
   streamed, every answer forced to ``--tokens`` tokens (``ignore_eos``, ``min_tokens``),
   temperature 0: p50/p90/p99 latency and time to first token, added ms and ratio;
2. ``--concurrency`` streams in flight (2 x N streams per round), rounds taken in turns:
   completion tokens per second and the gateway/bare ratio;
3. CPU seconds per 1,000 generated tokens of each process role (Serve proxy, gateway
   replica, head replica, engine; bare: API process, engine), from /proc/<pid>/stat
   read before and after each of that stack's calls or rounds;
4. the idle CPU of both stacks over ``--idle-s`` seconds with nothing to do.

Figures go to bench/results/vs_vllm-<time>.json and .png. Every process started is
stopped on exit, on Ctrl-C, on SIGTERM and when ``--timeout-s`` runs out.

``--variant LABEL:SPEC`` starts one more gateway stack, measured in the same turns
against the same bare server, so a change is judged by two ratios taken in one run
on one (shared, drifting) machine rather than by runs minutes apart. SPEC is a
comma-separated list of ``NAME=VALUE`` environment settings for its ``gateway run``,
and ``repo=PATH`` runs the gateway code of another checkout (the baseline):

    .venv/bin/python bench/vs_vllm.py --variant base:repo=/tmp/wt-base
    .venv/bin/python bench/vs_vllm.py --variant t0:RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0

    .venv/bin/python bench/vs_vllm.py                 # make bench-vllm
    .venv/bin/python bench/vs_vllm.py --quick         # smoke test, ~5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import proc_cpu
from bench.common import chat_once, free_port, host_facts, interleaved, pct
from bench.gateway_stack import (
    ENGINE,
    MODEL,
    Variant,
    gateway_config,
    start_gateway,
    wait_answering,
    wait_gateway,
)
from bench.servers import descendants, start_vllm, stop_tree
from bench.vs_vllm_report import plot, report

__all__ = ["ENGINE", "MODEL", "gateway_config", "parse_args", "start_gateway", "wait_gateway"]

REPO = Path(__file__).resolve().parent.parent
PERCENTILES = (0.5, 0.9, 0.99)
IDLE_SETTLE_S = 5.0
Call = Callable[[], Awaitable[tuple[float, float, int]]]


class BenchTimeout(Exception):
    """--timeout-s ran out (raised from SIGALRM)."""


# ---- measuring ------------------------------------------------------------------------------
@dataclass
class Stack:
    """One server under test: its client, its processes and what its calls cost."""

    name: str
    client: httpx.AsyncClient
    procs: list[proc_cpu.Proc]
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    cpu_by_process: dict[str, dict[str, float]] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    short_answers: int = 0

    async def measured(self, phase: str, work: Awaitable[int]) -> None:
        """Charge the CPU time of this stack's processes while ``work`` runs to ``phase``."""
        before = proc_cpu.snapshot(self.procs)
        produced = await work
        after = proc_cpu.snapshot(self.procs)
        totals = self.cpu.setdefault(phase, {})
        for role, seconds in proc_cpu.by_role(self.procs, before, after).items():
            totals[role] = totals.get(role, 0.0) + seconds
        per_process = self.cpu_by_process.setdefault(phase, {})
        for _, name, seconds in proc_cpu.by_process(self.procs, before, after):
            per_process[name] = per_process.get(name, 0.0) + seconds
        self.tokens[phase] = self.tokens.get(phase, 0) + produced

    def request(self, stream: bool, tokens: int) -> Call:
        """One chat call forced to ``tokens`` tokens; a shorter answer is counted."""
        extra = {"ignore_eos": True, "min_tokens": tokens}

        async def one() -> tuple[float, float, int]:
            result = await chat_once(self.client, MODEL, tokens, stream, extra)
            if result[2] != tokens:
                self.short_answers += 1
            return result

        return one

    def call(self, stream: bool, tokens: int, phase: str) -> Call:
        """``request``, its CPU time charged to ``phase``."""
        one = self.request(stream, tokens)

        async def charged() -> tuple[float, float, int]:
            out: list[tuple[float, float, int]] = []

            async def run() -> int:
                out.append(await one())
                return out[0][2]

            await self.measured(phase, run())
            return out[0]

        return charged

    def per_1k_tokens_by_process(self, phase: str) -> dict[str, float]:
        """The same per process (processes of one role apart, largest first)."""
        tokens = self.tokens.get(phase, 0)
        spent = sorted(self.cpu_by_process.get(phase, {}).items(), key=lambda kv: -kv[1])
        return {name: round(s / tokens * 1000, 3) for name, s in spent if s} if tokens else {}

    def per_1k_tokens(self, phase: str) -> dict[str, float]:
        tokens = self.tokens.get(phase, 0)
        if not tokens:
            return {}
        spent = self.cpu.get(phase, {})
        figures = {role: s / tokens * 1000 for role, s in sorted(spent.items())}
        figures["total"] = sum(spent.values()) / tokens * 1000
        return figures


async def check_honoured(gateway: Stack, tokens: int) -> None:
    """The gateway must pass ``ignore_eos``/``min_tokens`` on, or the workloads differ."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    resp = await gateway.client.post("/v1/chat/completions", json=body)
    resp.raise_for_status()
    ignored = resp.headers.get("x-service-ignored-params", "")
    produced = resp.json()["usage"]["completion_tokens"]
    if ignored or produced != tokens:
        raise SystemExit(
            f"gateway did not force the length (ignored: {ignored!r}, {produced} tokens "
            f"for {tokens}): the two workloads would differ"
        )


async def stream_round(stack: Stack, tokens: int, concurrency: int, phase: str) -> float:
    """2 x ``concurrency`` streams, ``concurrency`` in flight; completion tokens per second."""
    call = stack.request(True, tokens)
    sem = asyncio.Semaphore(concurrency)
    produced = 0

    async def one() -> None:
        nonlocal produced
        async with sem:
            result = await call()
        produced += result[2]

    async def run() -> int:
        await asyncio.gather(*(one() for _ in range(2 * concurrency)))
        return produced

    start = time.perf_counter()
    await stack.measured(phase, run())
    return produced / (time.perf_counter() - start)


async def idle(stacks: list[Stack], seconds: float) -> dict[str, Any]:
    """CPU share of a core of every process of both stacks, with no request in flight."""
    if seconds <= 0:
        return {}
    # vLLM's workers spin on their shared-memory queue for a second after each message
    # (shm_broadcast busy_loop_s): let that tail of the last call pass first.
    await asyncio.sleep(IDLE_SETTLE_S)
    everything = [p for s in stacks for p in s.procs]
    before = proc_cpu.snapshot(everything)
    start = time.perf_counter()
    await asyncio.sleep(seconds)
    after = proc_cpu.snapshot(everything)
    elapsed = time.perf_counter() - start
    result: dict[str, Any] = {"seconds": round(elapsed, 1)}
    for stack in stacks:
        rows = proc_cpu.by_process(stack.procs, before, after)
        result[stack.name] = {
            "total_core_share": round(sum(r[2] for r in rows) / elapsed, 4),
            "by_role": {
                role: round(s / elapsed, 4)
                for role, s in proc_cpu.by_role(stack.procs, before, after).items()
            },
            "by_process": [
                {"role": role, "process": name, "core_share": round(s / elapsed, 4)}
                for role, name, s in rows
            ],
        }
    return result


@dataclass(frozen=True)
class Target:
    """A started stack as ``measure`` reaches it: its name, URL, API key and processes."""

    name: str
    url: str
    key: str | None
    procs: list[proc_cpu.Proc]


async def measure(targets: list[Target], args: Any) -> dict[str, Any]:
    """Measure every stack in turns; ``targets[0]`` is the bare server, the rest gateways."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    timeout = httpx.Timeout(args.request_timeout_s)
    async with contextlib.AsyncExitStack() as exits:
        stacks = []
        for t in targets:
            headers = {"Authorization": f"Bearer {t.key}"} if t.key else None
            client = httpx.AsyncClient(
                base_url=t.url, headers=headers, timeout=timeout, limits=limits
            )
            stacks.append(Stack(t.name, await exits.enter_async_context(client), t.procs))
        for gateway in stacks[1:]:
            await check_honoured(gateway, args.tokens)
        for _ in range(args.warmup):
            for stack in stacks:
                await stack.request(True, args.tokens)()
                await stack.request(False, args.tokens)()
        progress(f"idle CPU of every stack over {args.idle_s:g} s")
        idle_cpu = await idle(stacks, args.idle_s)
        progress(f"sequential: {args.requests} calls per path, in turns")
        calls = {
            f"{s.name} {kind}": s.call(stream, args.tokens, "sequential")
            for kind, stream in (("json", False), ("stream", True))
            for s in stacks
        }
        seq = await interleaved(calls, args.requests, gap_s=args.gap_s)
        throughput: dict[str, dict[str, list[float]]] = {}
        for c in args.concurrency:
            progress(f"{c} concurrent streams: {args.rounds} rounds per path, in turns")
            rounds: dict[str, list[float]] = {s.name: [] for s in stacks}
            for _ in range(args.rounds):
                for stack in stacks:
                    rounds[stack.name].append(
                        await stream_round(stack, args.tokens, c, f"streams-{c}")
                    )
            throughput[str(c)] = rounds
    return summarize(seq, throughput, stacks, idle_cpu)


def _percentiles(values: list[float]) -> dict[str, float]:
    return {f"p{round(q * 100)}": round(pct(values, q) * 1000, 1) for q in PERCENTILES}


def compare(
    seq: dict[str, Any], throughput: dict[str, dict[str, list[float]]], name: str
) -> dict[str, Any]:
    """Latency percentiles and tokens/s of gateway stack ``name`` against the bare server."""
    latency: dict[str, Any] = {}
    for kind, key, attr in (
        ("non-streamed", "json", "latency"),
        ("streamed", "stream", "latency"),
        ("ttft", "stream", "ttft"),
    ):
        bare = _percentiles(getattr(seq[f"bare {key}"], attr))
        gateway = _percentiles(getattr(seq[f"{name} {key}"], attr))
        latency[kind] = {
            "bare_ms": bare,
            "gateway_ms": gateway,
            "added_ms": {p: round(gateway[p] - bare[p], 1) for p in bare},
            "ratio": {p: round(gateway[p] / bare[p], 3) if bare[p] else None for p in bare},
        }
    tps: dict[str, Any] = {}
    for c, rounds in throughput.items():
        b, g = rounds["bare"], rounds[name]
        tps[c] = {
            "bare": [round(x, 1) for x in b],
            "gateway": [round(x, 1) for x in g],
            "ratio": round(sum(g) / sum(b), 3),
            "ratio_per_round": [round(y / x, 3) for x, y in zip(b, g, strict=True)],
        }
    return {"latency": latency, "tokens_per_s": tps}


def summarize(
    seq: dict[str, Any],
    throughput: dict[str, dict[str, list[float]]],
    stacks: list[Stack],
    idle_cpu: dict[str, Any],
) -> dict[str, Any]:
    """The main gateway's comparison at the top level (as before variants), then each
    variant's under ``variants`` by its label."""
    main = compare(seq, throughput, "gateway")
    variants = {s.name[len("gateway[") : -1]: compare(seq, throughput, s.name) for s in stacks[2:]}
    phases = ["sequential", *(f"streams-{c}" for c in throughput)]
    cpu = {
        phase: {s.name: {r: round(v, 3) for r, v in s.per_1k_tokens(phase).items()} for s in stacks}
        for phase in phases
    }
    cpu_by_process = {
        phase: {s.name: s.per_1k_tokens_by_process(phase) for s in stacks} for phase in phases
    }
    return {
        **main,
        "variants": variants,
        "cpu_s_per_1k_tokens": cpu,
        "cpu_s_per_1k_tokens_by_process": cpu_by_process,
        "idle_cpu": idle_cpu,
        "short_answers": {s.name: s.short_answers for s in stacks},
    }


def progress(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


# ---- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        epilog="GATEWAY_MODELS_DIR picks the prepared-model cache both stacks load from.",
    )
    # Defaults of the figures --quick shrinks are None here, filled in below.
    parser.add_argument("--requests", type=int, help="sequential calls per path (20)")
    parser.add_argument("--tokens", type=int, help="tokens forced per answer (32)")
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",") if x],
        help="comma-separated stream counts (8,32,64)",
    )
    parser.add_argument("--rounds", type=int, help="throughput rounds per path (3)")
    parser.add_argument("--warmup", type=int, help="unmeasured calls per path (2)")
    parser.add_argument("--idle-s", type=float, help="idle CPU window; 0 skips it (20)")
    parser.add_argument(
        "--gap-s",
        type=float,
        default=0.0,
        help="pause before each sequential call, e.g. 1.5 to let vLLM's worker stop spinning (0)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 3 calls, 8 tokens, 4 streams, 1 round, 5 s idle (unless given)",
    )
    parser.add_argument(
        "--gateway-args",
        default="",
        help="extra `gateway run` options, e.g. '--no-dashboard' (quoted, shell-split)",
    )
    parser.add_argument(
        "--variant",
        type=Variant.parse,
        action="append",
        default=[],
        help="one more gateway stack measured in the same turns: LABEL:NAME=VALUE,... "
        "(environment of its `gateway run`; repo=PATH runs another checkout's code)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the servers' logs and state after success"
    )
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--request-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--timeout-s", type=int, default=3600, help="the whole run; processes stopped after"
    )
    args = parser.parse_args(argv)
    full = {"requests": 20, "tokens": 32, "concurrency": [8, 32, 64], "rounds": 3, "warmup": 2}
    full["idle_s"] = 20.0
    quick = {"requests": 3, "tokens": 8, "concurrency": [4], "rounds": 1, "warmup": 1}
    quick["idle_s"] = 5.0
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:  # a figure given on the command line wins
            setattr(args, name, value)
    return args


def _interrupt(signum: int, _frame: object) -> None:
    if signum == signal.SIGALRM:
        raise BenchTimeout("--timeout-s ran out")
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a background job inherits it ignored
        signal.signal(sig, _interrupt)
    signal.signal(signal.SIGALRM, _interrupt)
    signal.alarm(args.timeout_s)
    from deployments.local_models.prepared_models import ensure_model

    started = time.strftime("%Y-%m-%dT%H-%M-%S")
    model_path = ensure_model(MODEL)
    work = Path(tempfile.mkdtemp(prefix="vsvllm-"))
    vllm_port = free_port()
    progress(f"model {model_path}; logs and state in {work}")
    config = gateway_config(work / "gateway.yaml")
    gateways = [Variant("gateway", {}), *args.variant]
    procs: list[subprocess.Popen[bytes]] = []
    seen: list[psutil.Process] = []
    try:
        vllm = start_vllm(model_path, vllm_port, work / "vllm.log", ENGINE)
        procs.append(vllm)
        started_gateways = []
        for variant in gateways:
            name = "gateway" if variant.label == "gateway" else f"gateway[{variant.label}]"
            folder = work if name == "gateway" else work / f"gw-{variant.label}"
            port = free_port()
            own = config
            if variant.repo != REPO:
                folder.mkdir(parents=True, exist_ok=True)
                own = gateway_config(folder / "gateway.yaml", repo=variant.repo)
            proc, key = start_gateway(
                own,
                port,
                folder,
                model_path.parent,
                shlex.split(args.gateway_args),
                variant.env,
                variant.repo,
            )
            procs.append(proc)
            started_gateways.append((name, folder, port, proc, key))
            progress(f"starting `gateway run` {name} on :{port}")
        progress(f"starting vLLM on :{vllm_port}")
        bare_url = f"http://127.0.0.1:{vllm_port}"
        wait_answering(bare_url, "none", vllm, args.start_timeout_s, "vLLM server")
        targets = [Target("bare", bare_url, None, proc_cpu.classify(vllm.pid, "bare"))]
        seen = descendants(vllm.pid)
        for name, folder, port, proc, key in started_gateways:
            url = f"http://127.0.0.1:{port}"
            wait_gateway(url, key, proc, folder / "gateway.log", args.start_timeout_s)
            seen += descendants(proc.pid)
            targets.append(Target(name, url, key, proc_cpu.classify(proc.pid, "gateway")))
        for target in targets:
            roles = sorted({p.role for p in target.procs})
            progress(f"{target.name}: {len(target.procs)} processes ({', '.join(roles)})")
        result = asyncio.run(measure(targets, args))
    except BenchTimeout:
        print(f"timed out after {args.timeout_s} s; logs in {work}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; logs in {work}", file=sys.stderr)
        return 130
    finally:
        signal.alarm(0)
        progress("stopping every stack")
        for proc in reversed(procs):  # gateways first: SIGINT is their clean Ctrl-C path
            first = signal.SIGINT if proc is not procs[0] else signal.SIGTERM
            stop_tree(proc, first, 60.0, seen)
    result = {
        "started": started,
        "config": {
            "model": MODEL,
            "engine": ENGINE,
            "requests": args.requests,
            "tokens": args.tokens,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "quick": args.quick,
            "gateway_args": args.gateway_args,
            "variants": {v.label: v.describe() for v in args.variant},
            "command": " ".join(sys.argv),
        },
        "host": host_facts(),
        **result,
    }
    report(result)
    if not args.keep_logs:  # on failure the folder stays: its logs say why
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"vs_vllm-{started}{'-quick' if args.quick else ''}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    drawn = plot(result, stem.with_suffix(".png"))
    print(f"\nwrote {stem}.json{' and .png' if drawn else ' (no matplotlib: no plot)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
