"""LoRA adapters under load: TTFT and tokens/s for base-only, adapter-only and a 50/50 mix.

Starts ``gateway run`` on the SmolLM2-only config the other benches use (its catalog
entry as shipped: ``lora`` settings and the packaged ``json`` adapter), then runs each
phase with ``--streams`` concurrent streamed chats, ``--calls`` per stream, every
answer forced to ``--max-tokens`` tokens (``ignore_eos``) so the phases generate alike.
Phases run in rounds (base, adapter, mix, base, ...) so the machine's drift is charged
to all alike (docs/reference/adapters.md#performance):

    flock /tmp/heavy.lock .venv/bin/python bench/lora_bench.py --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import chat_once, free_port, pct
from bench.gateway_stack import MODEL, gateway_config, start_gateway, wait_gateway
from bench.servers import descendants, stop_tree

ADAPTER = f"{MODEL}:json"
PHASES = {"base": (MODEL,), "adapter": (ADAPTER,), "mix": (MODEL, ADAPTER)}


async def _phase(
    http: httpx.AsyncClient, models: tuple[str, ...], args: argparse.Namespace
) -> tuple[list[float], int, float]:
    """(TTFTs, completion tokens, wall seconds) of one phase."""
    ttfts: list[float] = []
    tokens = 0

    async def stream(index: int) -> None:
        nonlocal tokens
        for call in range(args.calls):
            model = models[(index + call) % len(models)]  # the mix: half and half
            extra = {"ignore_eos": True}
            _, ttft, produced = await chat_once(http, model, args.max_tokens, True, extra)
            ttfts.append(ttft)
            tokens += produced

    started = time.perf_counter()
    await asyncio.gather(*(stream(i) for i in range(args.streams)))
    return ttfts, tokens, time.perf_counter() - started


async def _measure(url: str, key: str, args: argparse.Namespace) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {key}"}
    seen: dict[str, tuple[list[float], int, float]] = {p: ([], 0, 0.0) for p in PHASES}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as http:
        for model in (MODEL, ADAPTER):  # warm-up: the adapter loaded, the graphs hot
            await chat_once(http, model, 4, True)
        for _ in range(args.rounds):
            for name, models in PHASES.items():
                ttfts, tokens, wall = await _phase(http, models, args)
                old = seen[name]
                seen[name] = (old[0] + ttfts, old[1] + tokens, old[2] + wall)
    return {
        name: {
            "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 1),
            "ttft_p90_ms": round(pct(ttfts, 0.9) * 1000, 1),
            "tokens_per_s": round(tokens / wall, 1),
            "calls": len(ttfts),
        }
        for name, (ttfts, tokens, wall) in seen.items()
    }


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--calls", type=int, default=3, help="chats per stream and phase")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupted)
    from deployments.local_models.prepared_models import ensure_model

    model_path = ensure_model(MODEL)
    ensure_model("smollm2-json-lora", model_path.parent / "smollm2-json-lora")
    work = Path(tempfile.mkdtemp(prefix="lorabench-"))
    port = free_port()
    config = gateway_config(work / "g.yaml")
    proc, key = start_gateway(config, port, work, model_path.parent, [])
    seen = []
    try:
        url = f"http://127.0.0.1:{port}"
        wait_gateway(url, key, proc, work / "gateway.log", args.start_timeout_s)
        seen = descendants(proc.pid)
        result: dict[str, object] = asyncio.run(_measure(url, key, args))
    finally:
        stop_tree(proc, signal.SIGINT, 60.0, seen)
    result["settings"] = {
        "streams": args.streams,
        "calls_per_stream": args.calls,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
