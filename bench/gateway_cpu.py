"""The gateway's own CPU cost per request, with an engine that costs nothing.

Runs the real FastAPI app in-process (auth on SQLite, limits, metering and the
usage ledger on) in front of the scripted engine of ``tests/fakes``, so every
microsecond measured is the gateway's: parsing, validation, auth, admission,
framing, billing. ``--profile`` prints where that time goes (cProfile).

    .venv/bin/python bench/gateway_cpu.py --requests 400 [--profile]

``--words N`` makes each answer N tokens long (on the scripted model with the
larger context window), so the per-chunk cost of a stream dominates the figure.

    .venv/bin/python bench/gateway_cpu.py --requests 200 --words 200
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serve_app.settings import GatewaySettings
from tests.fixtures.gateway import add_keys, build_harness, start_heads

BODY = {
    "model": "scripted-chat",
    "messages": [{"role": "user", "content": "one two three four five six seven eight"}],
    "max_tokens": 8,
}


def _body(words: int) -> dict[str, object]:
    """The default 8-token chat, or an N-word prompt echoed back as N chunks."""
    if not words:
        return BODY
    prompt = " ".join(f"w{i}" for i in range(words))
    return {
        "model": "scripted-tools",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": words,
    }


async def _run(n: int, stream: bool, words: int = 0) -> float:
    harness = build_harness(
        Path(tempfile.mkdtemp()) / "gw.db",
        {"limits": {"rpm": 10**6, "tpm": 10**9}},
        auth_cache_seconds=GatewaySettings().auth_cache_seconds,  # the production default
    )
    await start_heads(harness)
    add_keys(harness)
    body = {**_body(words), "stream": stream}
    async with harness.client(harness.keys["user"]) as http:
        for _ in range(20):
            (await http.post("/v1/chat/completions", json=body)).raise_for_status()
        start = time.perf_counter()
        for _ in range(n):
            resp = await http.post("/v1/chat/completions", json=body)
            resp.raise_for_status()
        elapsed = time.perf_counter() - start
    await harness.aclose()
    return elapsed / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--profile", action="store_true", help="print the top functions")
    parser.add_argument(
        "--words", type=int, default=0, help="tokens per answer (0: the 8-token default chat)"
    )
    args = parser.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    json_s = asyncio.run(_run(args.requests, stream=False, words=args.words))
    stream_s = asyncio.run(_run(args.requests, stream=True, words=args.words))
    if profiler:
        profiler.disable()
    tokens = args.words or 8
    print(f"gateway CPU per request (client included, {tokens} tokens, zero-cost engine, 1 core):")
    print(f"  json   {json_s * 1e6:8.0f} us  -> {1 / json_s:7.0f} req/s per core")
    print(f"  stream {stream_s * 1e6:8.0f} us  -> {1 / stream_s:7.0f} req/s per core")
    if profiler:
        stats = pstats.Stats(profiler).sort_stats("cumulative")
        stats.print_stats(35)


if __name__ == "__main__":
    main()
