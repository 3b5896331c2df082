"""Side by side: bare vLLM server, LiteLLM's proxy in front of it, and the gateway.

Same model (SmolLM2-135M, float32, CPU), same engine settings, same workload:

- bare:     vLLM's own OpenAI server (``python -m vllm.entrypoints.openai.api_server``);
- litellm:  LiteLLM's proxy forwarding to that same vLLM server;
- gateway:  Ray Serve ingress with auth, limits (Redis-free in-process counters) and
            metering on, in front of its own vLLM head built with the same settings.

Prints p50/p99 latency and TTFT for sequential streamed and JSON calls, the
ratios against bare, and completion tokens per second under N concurrent
streams. LiteLLM is run from its own virtualenv (``--litellm-bin``; it pins
versions the project does not use); without it that row is skipped.

    .venv/bin/python bench/proxy_compare.py --litellm-bin /tmp/litellm-venv/bin/litellm
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import HEADER, Series, chat_once, concurrent, free_port, sequential, wait_http
from bench.servers import SMOLLM2, mint_key, start_vllm, stop_tree

MODEL = SMOLLM2
LITELLM_KEY = "sk-bench-litellm-master-key"  # LiteLLM refuses to start without one
ENGINE = {"max_model_len": 1024, "max_num_seqs": 32, "kv_cache_memory_bytes": 256 * 1024**2}
BARE_ENGINE = {"dtype": "float32", "enforce_eager": True, **ENGINE}


def start_litellm(binary: str, upstream_port: int, port: int, log: Path) -> subprocess.Popen[bytes]:
    config = log.with_suffix(".yaml")
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://127.0.0.1:{upstream_port}/v1\n"
        "      api_key: unused\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"
    )
    cmd = [binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "LITELLM_TELEMETRY": "False"}
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def start_gateway(port: int, state: str) -> str:
    """Serve the gateway in this process's Ray; returns an API key."""
    import ray
    from ray import serve

    from deployments.local_models.prepared_models import ensure_model
    from serve_app.builders import build_gateway_app

    os.environ["GATEWAY_DATABASE_URL"] = f"sqlite:///{state}/gateway.db"
    os.environ["GATEWAY_MODELS_DIR"] = str(ensure_model(MODEL).parent)  # reuse the cache
    os.environ["GATEWAY_STATE_DIR"] = state
    key = mint_key(os.environ["GATEWAY_DATABASE_URL"])
    catalog = [
        {
            "id": MODEL,
            "head": "chat",
            "context_length": 1024,
            "max_output_tokens": 256,
            "engine": {"backend": "vllm", "config": {"model": f"prepared:{MODEL}", **ENGINE}},
            "deployment": {"max_ongoing_requests": 128, "ray_actor_options": {"num_cpus": 1}},
        }
    ]
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    args = {"catalog": catalog, "limits": {"rpm": 10**6, "tpm": 10**9}}
    serve.run(build_gateway_app(args), name="gateway", blocking=False)
    return key


async def measure(name: str, base_url: str, key: str, args: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=300, limits=limits
    ) as c:
        for _ in range(3):
            await chat_once(c, MODEL, args.max_tokens, True)
        stream = await sequential(lambda: chat_once(c, MODEL, args.max_tokens, True), args.requests)
        json_ = await sequential(lambda: chat_once(c, MODEL, args.max_tokens, False), args.requests)
        rps, tps = await concurrent(
            lambda: chat_once(c, MODEL, args.stream_tokens, True),
            args.concurrency * 2,
            args.concurrency,
        )
    print(f"  measured {name}", flush=True)
    return {"stream": stream, "json": json_, "rps": rps, "tps": tps}


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    cores = os.cpu_count() or 1
    print(
        f"\nworkload: {args.requests} sequential calls each, max_tokens={args.max_tokens}, "
        f"temperature 0; then {args.concurrency} concurrent streams of "
        f"{args.stream_tokens} tokens; {cores} cores"
    )
    print(HEADER)
    for name, r in results.items():
        print(r["stream"].row(f"{name} stream"))
        print(r["json"].row(f"{name} json"))
    bare = results["bare"]
    for name, r in results.items():
        if name == "bare":
            continue
        s: Series = r["stream"]
        j: Series = r["json"]
        added = (_p50(s) - _p50(bare["stream"])) * 1000
        added_json = (_p50(j) - _p50(bare["json"])) * 1000
        added_ttft = (_p50(s, ttft=True) - _p50(bare["stream"], ttft=True)) * 1000
        print(
            f"{name} vs bare: stream p50 {added:+.1f} ms, json p50 {added_json:+.1f} ms, "
            f"TTFT {added_ttft:+.1f} ms; tokens/s ratio {r['tps'] / bare['tps']:.3f}"
        )
    for name, r in results.items():
        print(
            f"{name:<8} {args.concurrency} streams: {r['tps']:7.1f} tok/s, "
            f"{r['rps']:.2f} req/s ({r['rps'] / cores:.2f} req/s per core)"
        )


def _p50(series: Series, ttft: bool = False) -> float:
    from bench.common import pct

    return pct(series.ttft if ttft else series.latency, 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--stream-tokens", type=int, default=32)
    parser.add_argument("--litellm-bin", default=os.environ.get("LITELLM_BIN", ""))
    args = parser.parse_args()

    from deployments.local_models.prepared_models import ensure_model

    model_path = ensure_model(MODEL)
    work = Path(tempfile.mkdtemp(prefix="gw-compare-"))
    vllm_port, litellm_port, gateway_port = free_port(), free_port(), free_port()
    procs = [start_vllm(model_path, vllm_port, work / "vllm.log", BARE_ENGINE)]
    results: dict[str, dict[str, Any]] = {}
    try:
        wait_http(f"http://127.0.0.1:{vllm_port}/v1/models", 300)
        results["bare"] = asyncio.run(measure("bare", f"http://127.0.0.1:{vllm_port}", "x", args))
        if args.litellm_bin:
            procs.append(start_litellm(args.litellm_bin, vllm_port, litellm_port, work / "ll.log"))
            wait_http(
                f"http://127.0.0.1:{litellm_port}/health/liveliness",
                300,
                headers={"Authorization": f"Bearer {LITELLM_KEY}"},
            )
            url = f"http://127.0.0.1:{litellm_port}"
            results["litellm"] = asyncio.run(measure("litellm", url, LITELLM_KEY, args))
        # The bare server and LiteLLM go first: idle, they still take CPU time on a 2-core
        # box, which would be charged to the gateway measured after them.
        _stop(procs)
        key = start_gateway(gateway_port, str(work))
        url = f"http://127.0.0.1:{gateway_port}"
        results["gateway"] = asyncio.run(measure("gateway", url, key, args))
    finally:
        _stop(procs)
    report(results, args)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        stop_tree(proc)  # the vLLM server's engine core too, should the server hang
    procs.clear()


if __name__ == "__main__":
    main()
