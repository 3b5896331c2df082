"""Live chat TTFT with a batch running vs without (docs/api.md, "Batches": idle capacity).

Starts ``gateway run`` on the SmolLM2-only config the other benches use, then, in
``--rounds`` rounds, measures ``--calls`` sequential streamed live chats with no batch,
then the same with a ``--lines``-line batch running (created before the phase,
cancelled after it, its running lines let finish), so the machine's drift is charged
to both phases alike. Prints the TTFT p50 of each and their ratio (the issue's bound:
at most 1.2):

    flock /tmp/heavy.lock .venv/bin/python bench/batch_ttft.py --rounds 3 --calls 15
"""

from __future__ import annotations

import argparse
import asyncio
import io
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


def _batch_file(lines: int, max_tokens: int) -> bytes:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write one short sentence about a river."}],
        "max_tokens": max_tokens,
    }
    rows = (
        {"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(lines)
    )
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


async def _start_batch(http: httpx.AsyncClient, content: bytes) -> str:
    upload = await http.post(
        "/v1/files",
        files={"file": ("b.jsonl", io.BytesIO(content))},
        data={"purpose": "batch"},
    )
    upload.raise_for_status()
    batch = await http.post(
        "/v1/batches",
        json={
            "input_file_id": upload.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    batch.raise_for_status()
    batch_id: str = batch.json()["id"]
    while (await http.get(f"/v1/batches/{batch_id}")).json()["request_counts"]["completed"] < 2:
        await asyncio.sleep(0.2)  # lines are running
    return batch_id


async def _stop_batch(http: httpx.AsyncClient, batch_id: str) -> int:
    answer = await http.post(f"/v1/batches/{batch_id}/cancel")
    while (await http.get(f"/v1/batches/{batch_id}")).json()["status"] == "cancelling":
        await asyncio.sleep(0.2)
    done: int = (await http.get(f"/v1/batches/{batch_id}")).json()["request_counts"]["completed"]
    return done if answer.status_code == 200 else -1


async def _phase(http: httpx.AsyncClient, calls: int, max_tokens: int) -> list[float]:
    ttfts = []
    for _ in range(calls):
        await asyncio.sleep(0.2)
        _, ttft, _ = await chat_once(http, MODEL, max_tokens, stream=True)
        ttfts.append(ttft)
    return ttfts


async def _measure(url: str, key: str, args: argparse.Namespace) -> dict[str, object]:
    content = _batch_file(args.lines, args.batch_max_tokens)
    alone: list[float] = []
    with_batch: list[float] = []
    lines_run = 0
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as http:
        await _phase(http, 3, args.max_tokens)  # warm-up
        for _ in range(args.rounds):
            alone += await _phase(http, args.calls, args.max_tokens)
            batch_id = await _start_batch(http, content)
            with_batch += await _phase(http, args.calls, args.max_tokens)
            lines_run += await _stop_batch(http, batch_id)
    p50_alone, p50_batch = statistics.median(alone), statistics.median(with_batch)
    return {
        "calls_per_phase": args.calls,
        "rounds": args.rounds,
        "batch_lines": args.lines,
        "batch_lines_run": lines_run,
        "ttft_p50_ms_alone": round(p50_alone * 1000, 1),
        "ttft_p50_ms_with_batch": round(p50_batch * 1000, 1),
        "ttft_p90_ms_alone": round(pct(alone, 0.9) * 1000, 1),
        "ttft_p90_ms_with_batch": round(pct(with_batch, 0.9) * 1000, 1),
        "ratio_p50": round(p50_batch / p50_alone, 3),
    }


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=15, help="live chats per phase")
    parser.add_argument("--lines", type=int, default=500, help="lines of the batch")
    parser.add_argument("--max-tokens", type=int, default=16, help="of each live chat")
    parser.add_argument("--batch-max-tokens", type=int, default=32, help="of each batch line")
    parser.add_argument(
        "--app-args", type=json.loads, default={}, help="JSON args, e.g. '{\"batches\": {...}}'"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupted)
    from deployments.local_models.prepared_models import ensure_model

    model_path = ensure_model(MODEL)
    work = Path(tempfile.mkdtemp(prefix="batchttft-"))
    port = free_port()
    config = gateway_config(work / "g.yaml", args.app_args)
    proc, key = start_gateway(config, port, work, model_path.parent, [])
    seen = []
    try:
        url = f"http://127.0.0.1:{port}"
        wait_gateway(url, key, proc, work / "gateway.log", args.start_timeout_s)
        seen = descendants(proc.pid)
        started = time.perf_counter()
        result = asyncio.run(_measure(url, key, args))
        result["seconds"] = round(time.perf_counter() - started, 1)
    finally:
        stop_tree(proc, signal.SIGINT, 60.0, seen)
    result["app_args"] = args.app_args
    result["cpus"] = os.cpu_count()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
