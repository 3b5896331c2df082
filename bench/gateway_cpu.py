"""The gateway's own CPU cost per request, with an engine that costs nothing.

Runs the real FastAPI app in-process (auth on SQLite, limits, metering and the
usage ledger on) in front of the scripted engine of ``tests/fakes``, so every
microsecond measured is the gateway's: parsing, validation, auth, admission,
framing, billing. ``--profile`` prints where that time goes (cProfile).

    .venv/bin/python bench/gateway_cpu.py --requests 400 [--profile]

``--words N`` makes each answer N tokens long (on the scripted model with the
larger context window), so the per-chunk cost of a stream dominates the figure.

    .venv/bin/python bench/gateway_cpu.py --requests 200 --words 200

``--route responses`` sends the same workload to ``POST /v1/responses`` (named
events, one ``response.output_text.delta`` per token). ``--render-events N``
times the stream renderers alone, no app and no client: N text deltas through
the chat chunker and through the responses ``ResponseBuilder``, per event.

    .venv/bin/python bench/gateway_cpu.py --route responses --requests 200 --words 200
    .venv/bin/python bench/gateway_cpu.py --render-events 20000
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serve_app.settings import GatewaySettings
from tests.fixtures.gateway import add_keys, build_harness, start_heads

BODY = {
    "model": "scripted-chat",
    "messages": [{"role": "user", "content": "one two three four five six seven eight"}],
    "max_tokens": 8,
}


def _body(words: int, route: str = "chat") -> dict[str, object]:
    """The default 8-token chat, or an N-word prompt echoed back as N chunks; on the
    responses route the same prompt as ``input``."""
    body: dict[str, object] = dict(BODY)
    if words:
        prompt = " ".join(f"w{i}" for i in range(words))
        body = {
            "model": "scripted-tools",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": words,
        }
    if route == "responses":
        messages = body.pop("messages")
        assert isinstance(messages, list)
        body["input"] = messages[0]["content"]
        body["max_output_tokens"] = body.pop("max_tokens")
    return body


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


async def _run(n: int, stream: bool, words: int = 0, route: str = "chat") -> tuple[float, float]:
    """(wall seconds, process CPU seconds) per request."""
    harness = build_harness(
        Path(tempfile.mkdtemp()) / "gw.db",
        {"limits": {"rpm": 10**6, "tpm": 10**9}},
        auth_cache_seconds=GatewaySettings().auth_cache_seconds,  # the production default
    )
    await start_heads(harness)
    add_keys(harness)
    body = {**_body(words, route), "stream": stream}
    path = PATHS[route]
    async with harness.client(harness.keys["user"]) as http:
        for _ in range(20):
            (await http.post(path, json=body)).raise_for_status()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            resp = await http.post(path, json=body)
            resp.raise_for_status()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    await harness.aclose()
    return elapsed / n, cpu / n


def _render_per_event(n: int) -> None:
    """CPU seconds per text-delta event of each stream renderer, best of 5 runs of ``n``
    (the responses run includes its opening and closing events)."""
    from serve_app.contract.chat import GenerationDone, TextDelta
    from serve_app.inference.chat.assemble import ChatChunker
    from serve_app.inference.responses.render import ResponseBuilder

    deltas = [TextDelta(0, text=f" w{i}") for i in range(n)]
    settings: Any = {  # what a plain request's Response states (inference.responses.echo)
        "instructions": None,
        "tools": [],
        "tool_choice": "none",
        "truncation": "disabled",
        "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}},
        "temperature": 1.0,
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": 0,
        "reasoning": None,
        "max_output_tokens": n,
        "max_tool_calls": None,
        "background": False,
        "service_tier": "default",
        "safety_identifier": None,
        "prompt_cache_key": None,
    }

    def chat() -> None:
        chunker = ChatChunker("chatcmpl-1", "m", False)
        for delta in deltas:
            chunker.delta(delta)

    def responses() -> None:
        builder = ResponseBuilder(
            "resp_1", "m", None, settings=settings, separate_channel=False, sources=None
        )
        builder.created()
        for delta in deltas:
            builder.delta(delta)
        builder.finished(GenerationDone(n, n), "stop")

    print(f"stream renderers, per text-delta event (best of 5 x {n} events, no app, 1 core):")
    for name, run in (("chat chunk", chat), ("responses event", responses)):
        best = float("inf")
        for _ in range(5):
            start = time.process_time()
            run()
            best = min(best, time.process_time() - start)
        print(f"  {name:16s} {best / n * 1e6:6.2f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--profile", action="store_true", help="print the top functions")
    parser.add_argument(
        "--words", type=int, default=0, help="tokens per answer (0: the 8-token default chat)"
    )
    parser.add_argument("--route", choices=sorted(PATHS), default="chat")
    parser.add_argument(
        "--render-events", type=int, default=0, help="time the stream renderers alone"
    )
    args = parser.parse_args()
    if args.render_events:
        _render_per_event(args.render_events)
        return
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    json_s = asyncio.run(_run(args.requests, stream=False, words=args.words, route=args.route))
    stream_s = asyncio.run(_run(args.requests, stream=True, words=args.words, route=args.route))
    if profiler:
        profiler.disable()
    tokens = args.words or 8
    print(
        f"gateway CPU per request ({PATHS[args.route]}, client included, {tokens} tokens, "
        "zero-cost engine, 1 core):"
    )
    for name, (wall, cpu) in (("json", json_s), ("stream", stream_s)):
        print(
            f"  {name:6s} {wall * 1e6:8.0f} us  -> {1 / wall:7.0f} req/s per core "
            f"(process CPU {cpu * 1e6:.0f} us)"
        )
    if profiler:
        stats = pstats.Stats(profiler).sort_stats("cumulative")
        stats.print_stats(35)


if __name__ == "__main__":
    main()
