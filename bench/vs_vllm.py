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

    .venv/bin/python bench/vs_vllm.py                 # make bench-vllm
    .venv/bin/python bench/vs_vllm.py --quick         # smoke test, ~5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
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
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import proc_cpu
from bench.common import chat_once, free_port, interleaved, pct
from bench.servers import SMOLLM2, descendants, mint_key, start_vllm, stop_tree

REPO = Path(__file__).resolve().parent.parent
MODEL = SMOLLM2
ENGINE: dict[str, object] = {
    "dtype": "float32",
    "max_model_len": 2048,
    "max_num_seqs": 16,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 256 * 1024**2,
}
"""Engine settings of both stacks, in the catalog's names (bench.servers maps them to flags)."""
BASE_CONFIG = "configs/local.yaml"
PERCENTILES = (0.5, 0.9, 0.99)
IDLE_SETTLE_S = 5.0
SHORT_KIND = {"non-streamed": "json", "streamed": "stream", "ttft": "TTFT"}
READY_LINE = b"==> gateway ready on"
Call = Callable[[], Awaitable[tuple[float, float, int]]]


class BenchTimeout(Exception):
    """--timeout-s ran out (raised from SIGALRM)."""


# ---- set-up -------------------------------------------------------------------------------
def gateway_config(target: Path, overrides: dict[str, Any] | None = None) -> Path:
    """configs/local.yaml with its catalog files replaced by the SmolLM2 chat entry alone.

    The entry is copied from the catalog file the config names (so the head runs with
    its real deployment options) and its engine settings pinned to ``ENGINE``.
    ``overrides`` replaces top-level keys of the application's ``args`` (a dict value
    is merged one level down: ``{"ledger": {"flush_interval_s": 5}}``).
    """
    from serve_app.cli.serve import load_serve_config

    config = load_serve_config(BASE_CONFIG)
    apps = [a for a in config["applications"] if a["import_path"].startswith("serve_app.builders")]
    if len(apps) != 1:
        raise SystemExit(f"{BASE_CONFIG}: expected one gateway application, found {len(apps)}")
    app = apps[0]
    args = dict(app.get("args") or {})
    entries = list(args.pop("catalog", []))
    for name in args.pop("catalog_files", []):
        entries += (yaml.safe_load((REPO / name).read_text()) or {}).get("models", [])
    chat = [e for e in entries if e.get("id") == MODEL and e.get("head") == "chat"]
    if not chat:
        raise SystemExit(f"{BASE_CONFIG}: no chat entry '{MODEL}' in its catalog")
    entry = dict(chat[0])
    entry["engine"] = {**entry["engine"], "config": {**entry["engine"]["config"], **ENGINE}}
    args["catalog"] = [entry]
    for name, value in (overrides or {}).items():
        merge = isinstance(value, dict) and isinstance(args.get(name), dict)
        args[name] = {**args[name], **value} if merge else value
    config["applications"] = [{**app, "args": args}]
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def start_gateway(
    config: Path, port: int, work: Path, models_dir: Path, extra_args: list[str]
) -> tuple[subprocess.Popen[bytes], str]:
    """``gateway run`` on ``config`` in its own session, with its own state, DB and Ray dir."""
    state = work / "state"
    state.mkdir()
    env = {
        **os.environ,
        "GATEWAY_STATE_DIR": str(state),
        "GATEWAY_DATABASE_URL": f"sqlite:///{state}/gateway.db",
        "GATEWAY_MODELS_DIR": str(models_dir),
        # Ray's temp dir, so ray.init cannot find (and join) a cluster someone else started.
        "RAY_TMPDIR": str(work / "r"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    env.pop("RAY_ADDRESS", None)
    key = _mint_key_in(env)
    cmd = [sys.executable, "-m", "serve_app.cli", "run", "--config", str(config)]
    cmd += ["--port", str(port), "--dashboard-port", str(free_port()), *extra_args]
    log = (work / "gateway.log").open("wb")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
    )
    return proc, key


def _mint_key_in(env: dict[str, str]) -> str:
    saved = {k: os.environ.get(k) for k in env if k.startswith("GATEWAY_")}
    os.environ.update({k: v for k, v in env.items() if k.startswith("GATEWAY_")})
    try:
        return mint_key(env["GATEWAY_DATABASE_URL"])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def wait_gateway(
    base_url: str, key: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float
) -> None:
    """Wait for ``gateway run``'s "ready" line, then for a chat answer.

    A head can answer before Serve reports the application running; the gateway's
    readiness poll then turns it back to "warming" (503) for a while, so the first
    200 alone is not the stack's steady state.
    """
    deadline = time.monotonic() + timeout_s
    while READY_LINE not in log.read_bytes():
        if proc.poll() is not None:
            raise RuntimeError(f"gateway run exited with {proc.returncode} while starting")
        if time.monotonic() > deadline:
            raise TimeoutError(f"gateway run was not ready within {timeout_s:.0f} s")
        time.sleep(2)
    wait_answering(base_url, key, proc, deadline - time.monotonic(), "gateway run")


def wait_answering(
    base_url: str, key: str, proc: subprocess.Popen[bytes], timeout_s: float, what: str
) -> None:
    """Poll a chat completion until it answers 200 (heads answer 503 while warming)."""
    deadline = time.monotonic() + timeout_s
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"Authorization": f"Bearer {key}"}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting")
        try:
            url = f"{base_url}/v1/chat/completions"
            if httpx.post(url, json=body, headers=headers, timeout=60).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{what} did not answer within {timeout_s:.0f} s")


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


async def measure(
    bare_url: str, gateway_url: str, key: str, procs: dict[str, list[proc_cpu.Proc]], args: Any
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    timeout = httpx.Timeout(args.request_timeout_s)
    auth = {"Authorization": f"Bearer {key}"}
    async with (
        httpx.AsyncClient(base_url=bare_url, timeout=timeout, limits=limits) as bare_client,
        httpx.AsyncClient(
            base_url=gateway_url, headers=auth, timeout=timeout, limits=limits
        ) as gw_client,
    ):
        bare = Stack("bare", bare_client, procs["bare"])
        gateway = Stack("gateway", gw_client, procs["gateway"])
        stacks = [bare, gateway]
        await check_honoured(gateway, args.tokens)
        for _ in range(args.warmup):
            for stack in stacks:
                await stack.request(True, args.tokens)()
                await stack.request(False, args.tokens)()
        progress(f"idle CPU of both stacks over {args.idle_s:g} s")
        idle_cpu = await idle(stacks, args.idle_s)
        progress(f"sequential: {args.requests} calls per path, in turns")
        seq = await interleaved(
            {
                "bare json": bare.call(False, args.tokens, "sequential"),
                "gateway json": gateway.call(False, args.tokens, "sequential"),
                "bare stream": bare.call(True, args.tokens, "sequential"),
                "gateway stream": gateway.call(True, args.tokens, "sequential"),
            },
            args.requests,
            gap_s=args.gap_s,
        )
        throughput: dict[str, dict[str, list[float]]] = {}
        for c in args.concurrency:
            progress(f"{c} concurrent streams: {args.rounds} rounds per path, in turns")
            rounds: dict[str, list[float]] = {"bare": [], "gateway": []}
            for _ in range(args.rounds):
                for stack in stacks:
                    rounds[stack.name].append(
                        await stream_round(stack, args.tokens, c, f"streams-{c}")
                    )
            throughput[str(c)] = rounds
    return summarize(seq, throughput, stacks, idle_cpu)


def _percentiles(values: list[float]) -> dict[str, float]:
    return {f"p{round(q * 100)}": round(pct(values, q) * 1000, 1) for q in PERCENTILES}


def summarize(
    seq: dict[str, Any],
    throughput: dict[str, dict[str, list[float]]],
    stacks: list[Stack],
    idle_cpu: dict[str, Any],
) -> dict[str, Any]:
    latency: dict[str, Any] = {}
    for kind, key, attr in (
        ("non-streamed", "json", "latency"),
        ("streamed", "stream", "latency"),
        ("ttft", "stream", "ttft"),
    ):
        bare = _percentiles(getattr(seq[f"bare {key}"], attr))
        gateway = _percentiles(getattr(seq[f"gateway {key}"], attr))
        latency[kind] = {
            "bare_ms": bare,
            "gateway_ms": gateway,
            "added_ms": {p: round(gateway[p] - bare[p], 1) for p in bare},
            "ratio": {p: round(gateway[p] / bare[p], 3) if bare[p] else None for p in bare},
        }
    tps: dict[str, Any] = {}
    for c, rounds in throughput.items():
        b, g = rounds["bare"], rounds["gateway"]
        tps[c] = {
            "bare": [round(x, 1) for x in b],
            "gateway": [round(x, 1) for x in g],
            "ratio": round(sum(g) / sum(b), 3),
            "ratio_per_round": [round(y / x, 3) for x, y in zip(b, g, strict=True)],
        }
    phases = ["sequential", *(f"streams-{c}" for c in throughput)]
    cpu = {
        phase: {s.name: {r: round(v, 3) for r, v in s.per_1k_tokens(phase).items()} for s in stacks}
        for phase in phases
    }
    cpu_by_process = {
        phase: {s.name: s.per_1k_tokens_by_process(phase) for s in stacks} for phase in phases
    }
    return {
        "latency": latency,
        "tokens_per_s": tps,
        "cpu_s_per_1k_tokens": cpu,
        "cpu_s_per_1k_tokens_by_process": cpu_by_process,
        "idle_cpu": idle_cpu,
        "short_answers": {s.name: s.short_answers for s in stacks},
    }


# ---- output ---------------------------------------------------------------------------------
def report(result: dict[str, Any]) -> None:
    cfg = result["config"]
    print(
        f"\n{cfg['model']} ({cfg['engine']}); {cfg['requests']} calls per path in turns, "
        f"{cfg['tokens']} tokens forced, temperature 0; {result['host']['cpus']} cores"
    )
    print(f"{'':<14}{'':>5}{'bare ms':>10}{'gateway ms':>12}{'added ms':>10}{'ratio':>8}")
    for kind, row in result["latency"].items():
        for p in row["bare_ms"]:
            print(
                f"{kind:<14}{p:>5}{row['bare_ms'][p]:>10.1f}{row['gateway_ms'][p]:>12.1f}"
                f"{row['added_ms'][p]:>+10.1f}{row['ratio'][p] or 0:>8.3f}"
            )
    print("\ncompletion tokens/s (2 x N streams per round, N in flight):")
    for c, row in result["tokens_per_s"].items():
        print(
            f"  {c:>3} streams: bare {_list(row['bare'])}  gateway {_list(row['gateway'])}  "
            f"ratio {row['ratio']:.3f}"
        )
    print("\nCPU seconds per 1,000 generated tokens:")
    for phase, stacks in result["cpu_s_per_1k_tokens"].items():
        for name, roles in stacks.items():
            parts = ", ".join(f"{r} {v:.2f}" for r, v in roles.items() if r != "total")
            print(f"  {phase:<12}{name:<8} total {roles.get('total', 0):6.2f}: {parts}")
    idle_cpu = result["idle_cpu"]
    if idle_cpu:
        print(f"\nidle, {idle_cpu['seconds']} s with nothing to do (share of one core):")
        for name in ("bare", "gateway"):
            stack = idle_cpu[name]
            roles = ", ".join(f"{r} {v:.3f}" for r, v in stack["by_role"].items())
            print(f"  {name:<8} {stack['total_core_share']:.3f}: {roles}")
        for row in idle_cpu["gateway"]["by_process"][:8]:
            print(f"    {row['core_share']:.3f}  {row['process']}")
    short = result["short_answers"]
    if any(short.values()):
        print(f"\nWARNING: answers shorter than --tokens: {short}")


def _list(values: list[float]) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def plot(result: dict[str, Any], target: Path) -> bool:
    """Latency percentiles and tokens/s, bare vs gateway; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax_lat, ax_tps) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels, bare, gateway = [], [], []
    for kind, row in result["latency"].items():
        for p in row["bare_ms"]:
            labels.append(f"{SHORT_KIND[kind]}\n{p}")
            bare.append(row["bare_ms"][p])
            gateway.append(row["gateway_ms"][p])
    xs = range(len(labels))
    ax_lat.bar([x - 0.2 for x in xs], bare, 0.4, label="vLLM server")
    ax_lat.bar([x + 0.2 for x in xs], gateway, 0.4, label="gateway")
    ax_lat.set_xticks(list(xs), labels, fontsize=7)
    ax_lat.set_ylabel("ms")
    ax_lat.set_title(f"latency, {result['config']['tokens']} tokens, one call at a time")
    ax_lat.legend()
    conc = list(result["tokens_per_s"])
    for name in ("bare", "gateway"):
        rounds = [result["tokens_per_s"][c][name] for c in conc]
        mean = [sum(r) / len(r) for r in rounds]
        err = [[m - min(r) for m, r in zip(mean, rounds, strict=True)]]
        err.append([max(r) - m for m, r in zip(mean, rounds, strict=True)])
        label = "vLLM server" if name == "bare" else "gateway"
        ax_tps.errorbar([int(c) for c in conc], mean, yerr=err, marker="o", capsize=4, label=label)
    ax_tps.set_xticks([int(c) for c in conc])
    ax_tps.set_ylim(bottom=0)
    ax_tps.set_xlabel("concurrent streams")
    ax_tps.set_ylabel("completion tokens/s (min-mean-max of rounds)")
    ax_tps.set_title("throughput")
    ax_tps.legend()
    fig.suptitle(f"gateway vs vLLM's OpenAI server - {result['started']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return True


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
    from deployments.engines.model_prep import ensure_model

    started = time.strftime("%Y-%m-%dT%H-%M-%S")
    model_path = ensure_model(MODEL)
    work = Path(tempfile.mkdtemp(prefix="vsvllm-"))
    vllm_port, gw_port = free_port(), free_port()
    progress(f"model {model_path}; logs and state in {work}")
    config = gateway_config(work / "gateway.yaml")
    procs: list[subprocess.Popen[bytes]] = []
    seen: list[psutil.Process] = []
    try:
        vllm = start_vllm(model_path, vllm_port, work / "vllm.log", ENGINE)
        procs.append(vllm)
        gateway, key = start_gateway(
            config, gw_port, work, model_path.parent, shlex.split(args.gateway_args)
        )
        procs.append(gateway)
        progress(f"starting vLLM on :{vllm_port} and `gateway run` on :{gw_port}")
        bare_url, gw_url = f"http://127.0.0.1:{vllm_port}", f"http://127.0.0.1:{gw_port}"
        wait_answering(bare_url, "none", vllm, args.start_timeout_s, "vLLM server")
        wait_gateway(gw_url, key, gateway, work / "gateway.log", args.start_timeout_s)
        seen = descendants(gateway.pid) + descendants(vllm.pid)
        stacks = {
            "bare": proc_cpu.classify(vllm.pid, "bare"),
            "gateway": proc_cpu.classify(gateway.pid, "gateway"),
        }
        for name, found in stacks.items():
            roles = sorted({p.role for p in found})
            progress(f"{name}: {len(found)} processes ({', '.join(roles)})")
        result = asyncio.run(measure(bare_url, gw_url, key, stacks, args))
    except BenchTimeout:
        print(f"timed out after {args.timeout_s} s; logs in {work}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; logs in {work}", file=sys.stderr)
        return 130
    finally:
        signal.alarm(0)
        progress("stopping both stacks")
        for proc in reversed(procs):  # gateway first: SIGINT is its clean Ctrl-C path
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
            "command": " ".join(sys.argv),
        },
        "host": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "loadavg_after": os.getloadavg(),
        },
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
