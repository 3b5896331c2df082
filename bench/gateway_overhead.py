"""Gateway overhead over the bare engine deployment, measured in one run.

Starts Ray Serve with the gateway and the real vLLM head (SmolLM2 on CPU),
then sends the same chat workload two ways:

- bare: a DeploymentHandle call straight to the head deployment from this
  process (the engine's own cost plus Ray's handle hop; no HTTP, no auth);
- gateway: HTTP through the Serve proxy and the full gateway (auth, catalog,
  validation, limits, metering and the usage ledger, streaming framing).

Prints p50/p99 latency and time to first token for each, the difference and
the ratio, plus requests per second per CPU core under concurrency. Also
prints start-up time (Ray up -> application running -> first answer).

    .venv/bin/python bench/gateway_overhead.py --requests 30 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    HEADER,
    PROMPT,
    Series,
    chat_once,
    concurrent,
    free_port,
    interleaved,
    pct,
)
from bench.servers import SMOLLM2, mint_key
from serve_app.contract.chat import GenerationDone, HeadRequest, PromptSpec, SamplingSpec, TextDelta

MODEL = SMOLLM2


def _catalog(stream_batch_ms: float) -> list[dict[str, Any]]:
    return [
        {
            "id": MODEL,
            "head": "chat",
            "context_length": 1024,
            "max_output_tokens": 64,
            "engine": {
                "backend": "vllm",
                "config": {"model": f"prepared:{MODEL}", "max_model_len": 1024, "max_num_seqs": 16},
            },
            "deployment": {
                "max_ongoing_requests": 64,
                "ray_actor_options": {"num_cpus": 1},
                "stream_batch_ms": stream_batch_ms,
            },
        }
    ]


async def _bare_once(handle: Any, max_tokens: int) -> tuple[float, float, int]:
    request = HeadRequest(
        request_id=uuid.uuid4().hex,
        prompts=[PromptSpec(kind="chat", messages=[{"role": "user", "content": PROMPT}])],
        sampling=SamplingSpec(max_tokens=0, temperature=0.0),
        max_tokens=max_tokens,
        max_tokens_param="max_tokens",
        max_output_tokens=64,
    )
    start = time.perf_counter()
    ttft, tokens = 0.0, 0
    async for batch in handle.options(stream=True).generate.remote(request):
        for event in batch:
            if isinstance(event, TextDelta) and event.text and not ttft:
                ttft = time.perf_counter() - start
            if isinstance(event, GenerationDone):
                tokens = event.completion_tokens
    return time.perf_counter() - start, ttft, tokens


async def _measure(handle: Any, base_url: str, key: str, args: argparse.Namespace) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=120, limits=limits
    ) as c:

        def bare() -> Any:
            return _bare_once(handle, args.max_tokens)

        def gateway(stream: bool) -> Any:
            return lambda: chat_once(c, MODEL, args.max_tokens, stream)

        for _ in range(3):  # warm both paths
            await bare()
            await gateway(True)()
        paths = {
            "bare (handle)": bare,
            "gateway stream": gateway(True),
            "gateway json": gateway(False),
        }
        runs = await interleaved(paths, args.requests)
        bare_rps, _ = await concurrent(bare, args.requests * 2, args.concurrency)
        gw_rps, _ = await concurrent(gateway(False), args.requests * 2, args.concurrency)
    _report(runs, bare_rps, gw_rps, args)


def _report(
    runs: dict[str, Series], bare_rps: float, gw_rps: float, args: argparse.Namespace
) -> None:
    cores = os.cpu_count() or 1
    print(
        f"\nworkload: {args.requests} sequential requests, max_tokens={args.max_tokens}, "
        f"temperature 0; throughput at concurrency {args.concurrency}; {cores} cores; "
        f"head stream_batch_ms={args.stream_batch_ms:g}"
    )
    print(HEADER)
    for name, series in runs.items():
        print(series.row(name))
    bare = runs["bare (handle)"]
    for name in ("gateway stream", "gateway json"):
        lat = runs[name].latency
        added50 = (pct(lat, 0.5) - pct(bare.latency, 0.5)) * 1000
        added99 = (pct(lat, 0.99) - pct(bare.latency, 0.99)) * 1000
        ratio = pct(lat, 0.5) / pct(bare.latency, 0.5)
        print(
            f"added latency ({name}): p50 {added50:+.1f} ms, p99 {added99:+.1f} ms, "
            f"ratio p50 {ratio:.3f}"
        )
    added_ttft = (pct(runs["gateway stream"].ttft, 0.5) - pct(bare.ttft, 0.5)) * 1000
    print(f"added TTFT p50: {added_ttft:+.1f} ms")
    print(
        f"throughput: bare {bare_rps:.2f} req/s ({bare_rps / cores:.2f}/core), gateway "
        f"{gw_rps:.2f} req/s ({gw_rps / cores:.2f}/core), ratio {gw_rps / bare_rps:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30, help="sequential requests per path")
    parser.add_argument("--concurrency", type=int, default=8, help="for the throughput runs")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per answer")
    parser.add_argument(
        "--stream-batch-ms",
        type=float,
        default=20.0,
        help="the head's batch window (catalog deployment.stream_batch_ms; 0 = per event)",
    )
    args = parser.parse_args()

    import ray
    from ray import serve

    from deployments.local_models.prepared_models import ensure_model
    from serve_app.builders import build_gateway_app

    ensure_model(MODEL)
    state = tempfile.mkdtemp(prefix="gw-bench-")
    db_url = f"sqlite:///{state}/gateway.db"
    os.environ["GATEWAY_DATABASE_URL"] = db_url
    os.environ["GATEWAY_AUTH_CACHE_SECONDS"] = "5"
    key = mint_key(db_url)
    port = free_port()

    t0 = time.perf_counter()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    t_ray = time.perf_counter()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # Limits configured (far above the load) so every request is admitted and settled
    # against real counters: the overhead measured is the gateway's with limits on.
    app_args = {
        "catalog": _catalog(args.stream_batch_ms),
        "limits": {"rpm": 10**6, "tpm": 10**9},
    }
    serve.run(build_gateway_app(app_args), name="gateway", blocking=False)
    t_app = time.perf_counter()
    base_url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}) as c:
        c.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=120,
        ).raise_for_status()
    t_first = time.perf_counter()
    print(
        f"start-up: ray {t_ray - t0:.1f} s, application running {t_app - t0:.1f} s, "
        f"first answer {t_first - t0:.1f} s"
    )
    handle = serve.get_deployment_handle(f"chat-{MODEL}", app_name="gateway")
    try:
        asyncio.run(_measure(handle, base_url, key, args))
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
