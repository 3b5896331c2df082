"""Shared pieces of the benchmarks: percentiles, ports, OpenAI-style HTTP workloads."""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import httpx

PROMPT = "Write one short sentence about the sea."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def host_facts() -> dict[str, object]:
    """The machine a result was measured on, written next to the figures."""
    return {
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "loadavg_after": os.getloadavg(),
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Series:
    """Latencies (s), times to first token (s) and tokens of one workload."""

    latency: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0

    def row(self, name: str) -> str:
        first = f"{pct(self.ttft, 0.5) * 1000:8.1f}" if any(self.ttft) else "       -"
        return (
            f"{name:<26}{pct(self.latency, 0.5) * 1000:9.1f}"
            f"{pct(self.latency, 0.99) * 1000:9.1f}{first}"
            f"{statistics.mean(self.latency) * 1000:9.1f}"
        )


HEADER = f"{'path':<26}{'p50 ms':>9}{'p99 ms':>9}{'ttft ms':>8}{'mean ms':>9}"


async def chat_once(
    client: httpx.AsyncClient,
    model: str,
    max_tokens: int,
    stream: bool,
    extra: Mapping[str, object] | None = None,
) -> tuple[float, float, int]:
    """One chat call: (latency, time to first content, completion tokens).

    ``extra`` adds fields to the body (vLLM's ``ignore_eos``/``min_tokens`` to force
    the answer's length, so every server generates the same number of tokens).
    """
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        **(extra or {}),
    }
    start = time.perf_counter()
    if not stream:
        resp = await client.post("/v1/chat/completions", json=body)
        resp.raise_for_status()
        tokens = int(resp.json()["usage"]["completion_tokens"])
        return time.perf_counter() - start, 0.0, tokens
    body["stream_options"] = {"include_usage": True}
    ttft, tokens = 0.0, 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            has_text = '"content":"' in line and '"content":""' not in line
            if line.startswith("data: ") and has_text and not ttft:
                ttft = time.perf_counter() - start
            if '"usage":{' in line and '"completion_tokens"' in line:
                tokens = _completion_tokens(line)
    return time.perf_counter() - start, ttft, tokens


def _completion_tokens(line: str) -> int:
    import json

    data = json.loads(line[len("data: ") :])
    usage = data.get("usage") or {}
    return int(usage.get("completion_tokens") or 0)


Call = Callable[[], Awaitable[tuple[float, float, int]]]


async def sequential(call: Call, n: int) -> Series:
    series = Series()
    for _ in range(n):
        latency, ttft, tokens = await call()
        series.latency.append(latency)
        series.ttft.append(ttft)
        series.tokens += tokens
    return series


async def interleaved(calls: dict[str, Call], n: int, gap_s: float = 0.0) -> dict[str, Series]:
    """``n`` sequential calls of each path, taken in turns (a, b, c, a, b, c, ...).

    On a shared 2-core box the machine's speed drifts during a run (engine
    warm-up, background daemons); measuring one path after the other charges
    that drift to whichever path ran first, turns do not. ``gap_s`` pauses before
    each call: vLLM's worker busy-spins ~1 s after a request, which otherwise
    slows whichever call of the other stack comes next.
    """
    runs = {name: Series() for name in calls}
    for _ in range(n):
        for name, call in calls.items():
            if gap_s:
                await asyncio.sleep(gap_s)
            latency, ttft, tokens = await call()
            runs[name].latency.append(latency)
            runs[name].ttft.append(ttft)
            runs[name].tokens += tokens
    return runs


async def concurrent(call: Call, n: int, concurrency: int) -> tuple[float, float]:
    """(requests per second, completion tokens per second) with ``concurrency`` in flight."""
    sem = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one() -> None:
        nonlocal tokens
        async with sem:
            produced = (await call())[2]
        tokens += produced  # not `tokens += await ...`: that reads tokens before awaiting

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.perf_counter() - start
    return n / elapsed, tokens / elapsed


def wait_http(url: str, timeout_s: float = 180.0, headers: dict[str, str] | None = None) -> None:
    """Poll ``url`` until it answers 200 (a server still loading its model)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2, headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} did not come up within {timeout_s:.0f} s")
