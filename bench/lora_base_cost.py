"""What LoRA support costs requests that use no adapter, on vLLM's own server (issue 43 item 4).

Starts vLLM's OpenAI server several times on the prepared SmolLM2 with the benches' engine
settings (bench/gateway_stack.py ``ENGINE``), each with different LoRA flags, and runs
rounds of ``--concurrency`` streams x ``--tokens`` forced tokens of the base model on each,
rounds taken in turns. No gateway: this isolates the engine's side, to see whether some
vLLM setting removes the cost before routing base traffic away from LoRA replicas.

Servers (``--servers`` picks a subset):

- ``off``:   no ``--enable-lora``;
- ``lora``:  the local catalog's ``lora`` block (rank 8, 2 slots);
- ``min``:   the smallest LoRA setup the packaged adapter fits (rank 8, 1 slot, 1 CPU slot);
- ``qkv``:   the catalog's block with LoRA layers on ``qkv_proj`` alone (the packaged adapter's
             ``q_proj``/``v_proj``), instead of every linear layer.

    flock /tmp/heavy.lock env PYTHONPATH=$PWD .venv/bin/python bench/lora_base_cost.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, host_facts
from bench.gateway_stack import ENGINE, MODEL, wait_answering
from bench.servers import start_vllm, stop_tree

_LORA = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"]
SERVERS: dict[str, list[str]] = {
    "off": [],
    "lora": _LORA,
    "min": ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "1", "--max-cpu-loras", "1"],
    "qkv": [*_LORA, "--lora-target-modules", "qkv_proj"],
}


async def stream_one(client: httpx.AsyncClient, tokens: int) -> int:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write one short sentence about the sea."}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    produced = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: {") and '"usage":{' in line:
                usage = json.loads(line[6:]).get("usage") or {}
                produced = int(usage.get("completion_tokens") or produced)
    return produced


async def one_round(client: httpx.AsyncClient, tokens: int, concurrency: int) -> float:
    """2 x ``concurrency`` streams, ``concurrency`` in flight: completion tokens per second."""
    sem = asyncio.Semaphore(concurrency)

    async def one() -> int:
        async with sem:
            return await stream_one(client, tokens)

    start = time.perf_counter()
    produced = sum(await asyncio.gather(*(one() for _ in range(2 * concurrency))))
    return produced / (time.perf_counter() - start)


async def measure(urls: dict[str, str], args: argparse.Namespace) -> dict[str, list[float]]:
    rounds: dict[str, list[float]] = {name: [] for name in urls}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    clients = {
        n: httpx.AsyncClient(base_url=u, timeout=300, limits=limits) for n, u in urls.items()
    }
    try:
        for client in clients.values():  # warm-up, unmeasured
            await one_round(client, 8, 4)
        for r in range(args.rounds):
            for name, client in clients.items():
                rounds[name].append(await one_round(client, args.tokens, args.concurrency))
                print(f"round {r + 1} {name}: {rounds[name][-1]:.1f} tokens/s", file=sys.stderr)
    finally:
        for client in clients.values():
            await client.aclose()
    return rounds


def _stop(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # the servers are stopped in ``finally``


def main() -> int:
    signal.signal(signal.SIGTERM, _stop)
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--servers", default="off,lora,qkv")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    from deployments.local_models.prepared_models import ensure_model

    model_path = ensure_model(MODEL)
    work = Path(tempfile.mkdtemp(prefix="lora-base-"))
    names = [n for n in args.servers.split(",") if n]
    procs = {}
    urls = {}
    try:
        for name in names:
            port = free_port()
            procs[name] = start_vllm(
                model_path, port, work / f"{name}.log", ENGINE, extra_args=SERVERS[name]
            )
            urls[name] = f"http://127.0.0.1:{port}"
        for name in names:
            wait_answering(urls[name], "none", procs[name], 600, f"vLLM {name}")
        rounds = asyncio.run(measure(urls, args))
    finally:
        for proc in procs.values():
            stop_tree(proc)
    base = sum(rounds[names[0]])
    result = {
        "started": time.strftime("%Y-%m-%dT%H-%M"),
        "command": " ".join(sys.argv),
        "flags": {n: SERVERS[n] for n in names},
        "tokens_per_s": {n: [round(x, 1) for x in v] for n, v in rounds.items()},
        f"ratio_to_{names[0]}": {n: round(sum(v) / base, 3) for n, v in rounds.items()},
        "host": host_facts(),
    }
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"lora_base_cost-{result['started']}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
