"""A mixed soak of ``gateway run``: errors, the ledger against what clients saw, memory, OOM kills.

Starts ``gateway run`` on CONFIG (default: what ``make run`` serves) in a fresh state
folder that shares the models cache, as ``memory_budget.py`` does, mints a key, and runs
``--workers`` clients for ``--minutes``. Each client loops over a mix of calls, picked at
random with fixed weights: SmolLM2 chat (plain and streamed with usage), embeddings, rerank,
speech, and a short call to the tool model (a sleeping head: its first call wakes it). A
503 ``model_warming`` is waited out as a client honouring ``Retry-After`` would (counted,
not an error); anything else that is not a 200 is an error.

At the end it prints, and returns non-zero unless all hold:

* errors: none;
* the ledger (``usage_records`` of the key's user) against the usage the clients were
  shown, per model: the same number of requests and the same prompt and completion
  tokens (speech: requests only; it bills audio seconds);
* the stack's peak memory (PSS of the whole process tree, and the machine's "used") and
  how many workers Ray's memory monitor killed.

    .venv/bin/python bench/soak.py                     # 8 clients, 10 minutes
    .venv/bin/python bench/soak.py --workers 16 --minutes 2
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.memory_budget import (  # noqa: E402
    GiB,
    Sampler,
    machine_used,
    oom_kills,
    start_gateway_run,
    stop_gateway_run,
    table,
    wait_ready,
)
from bench.servers import mint_key  # noqa: E402

CHAT = "smollm2-135m-instruct"
TOOLS = "qwen2.5-coder-1.5b-instruct"
EMBED = "all-minilm-l6-v2"
SPEECH = "piper-joe-tts"
MIX = {"chat": 30, "stream": 25, "embed": 25, "rerank": 10, "speech": 8, "tools": 2}
"""Relative weights of the call kinds."""


@dataclass
class Tally:
    """What the clients saw: per model, requests and the usage they were shown."""

    requests: Counter[str] = field(default_factory=Counter)
    prompt: Counter[str] = field(default_factory=Counter)
    completion: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    warming: int = 0
    errors: list[str] = field(default_factory=list)
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, model: str, usage: dict[str, Any] | None) -> None:
        self.requests[model] += 1
        usage = usage or {}
        self.prompt[model] += int(usage.get("prompt_tokens") or 0)
        self.completion[model] += int(usage.get("completion_tokens") or 0)


def _call(kind: str, n: int) -> tuple[str, str, dict[str, Any]]:
    """(model, path, body) of call number ``n`` of ``kind``."""
    question = f"In one short sentence, what is {n % 97} plus {n % 13}?"
    if kind in ("chat", "stream", "tools"):
        body: dict[str, Any] = {
            "model": TOOLS if kind == "tools" else CHAT,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 8 if kind == "tools" else 24,
        }
        if kind == "stream":
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return str(body["model"]), "/v1/chat/completions", body
    if kind == "embed":
        texts = [
            f"soak sentence {n}-{i} about {('rivers', 'markets', 'cats')[i % 3]}" for i in range(8)
        ]
        return EMBED, "/v1/embeddings", {"model": EMBED, "input": texts}
    if kind == "rerank":
        docs = [
            f"document {n}-{i} on {('rain', 'stocks', 'a cat on a mat')[i % 3]}" for i in range(4)
        ]
        return (
            EMBED,
            "/v1/rerank",
            {"model": EMBED, "query": "where is the cat?", "documents": docs},
        )
    return (
        SPEECH,
        "/v1/audio/speech",
        {"model": SPEECH, "input": f"Soak call {n}.", "voice": "tara"},
    )


async def _once(http: httpx.AsyncClient, kind: str, n: int, tally: Tally) -> None:
    model, path, body = _call(kind, n)
    started = time.monotonic()
    while True:
        if body.get("stream"):
            usage, status, text, retry = await _stream(http, path, body)
        else:
            resp = await http.post(path, json=body)
            status, text, retry = resp.status_code, resp.text, resp.headers.get("retry-after")
            usage = resp.json().get("usage") if status == 200 and kind != "speech" else None
        if status == 503 and '"model_warming"' in text:
            tally.warming += 1
            await asyncio.sleep(min(float(retry or 5), 10.0))
            continue
        break
    if status != 200:
        tally.errors.append(f"{kind} {model}: {status} {text[:200]}")
        return
    tally.add(model, usage)
    tally.kinds[kind] += 1
    tally.latency[kind].append(time.monotonic() - started)


async def _stream(
    http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> tuple[dict[str, Any] | None, int, str, str | None]:
    import json

    usage = None
    async with http.stream("POST", path, json=body) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            return None, resp.status_code, text, resp.headers.get("retry-after")
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
    if usage is None:
        return None, 599, "stream ended without a usage chunk", None
    return usage, 200, "", None


async def _client(base: str, key: str, until: float, seed: int, tally: Tally) -> None:
    rng = random.Random(seed)
    kinds, weights = zip(*MIX.items(), strict=True)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=600) as http:
        n = seed * 100_000
        while time.monotonic() < until:
            n += 1
            try:
                await _once(http, rng.choices(kinds, weights)[0], n, tally)
            except httpx.HTTPError as err:
                tally.errors.append(f"transport: {type(err).__name__} {err}")


def _ledger(database: Path, user: str = "bench") -> dict[str, tuple[int, int, int]]:
    """Per model: (requests, prompt tokens, completion tokens) in the ledger for ``user``."""
    import sqlalchemy as sa

    engine = sa.create_engine(f"sqlite:///{database}")
    query = sa.text(
        "SELECT model, COUNT(*), SUM(prompt_tokens), SUM(completion_tokens) FROM usage_records "
        "WHERE user_id = (SELECT id FROM users WHERE name = :user) GROUP BY model"
    )
    with engine.connect() as conn:
        rows = conn.execute(query, {"user": user}).all()
    engine.dispose()
    return {str(m): (int(r), int(p or 0), int(c or 0)) for m, r, p, c in rows}


def _compare(tally: Tally, ledger: dict[str, tuple[int, int, int]]) -> list[str]:
    problems = []
    for model in sorted(set(tally.requests) | set(ledger)):
        # Speech is compared by requests: its answer is audio, with no usage to compare.
        width = 1 if model == SPEECH else 3
        seen = (tally.requests[model], tally.prompt[model], tally.completion[model])[:width]
        recorded = ledger.get(model, (0, 0, 0))[:width]
        if recorded != seen:
            problems.append(f"{model}: clients saw {seen}, ledger has {ledger.get(model)}")
    return problems


def _settled_ledger(database: Path, tally: Tally, wait_s: float = 30.0) -> list[str]:
    """The comparison once the spool has been flushed (it commits every second)."""
    deadline = time.monotonic() + wait_s
    while True:
        problems = _compare(tally, _ledger(database))
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(2.0)


def _report(tally: Tally, minutes: float) -> None:
    total = sum(tally.kinds.values())
    print(
        f"\n{total} calls in {minutes:g} min ({total / minutes / 60:.1f}/s), "
        f"{tally.warming} model_warming waits, {len(tally.errors)} errors"
    )
    for kind, times in sorted(tally.latency.items()):
        times = sorted(times)
        p50, p95 = times[len(times) // 2], times[int(len(times) * 0.95)]
        print(f"    {kind:<8} {len(times):6d} calls   p50 {p50:6.2f} s   p95 {p95:6.2f} s")
    for error in tally.errors[:10]:
        print(f"    error: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", default="configs/local.yaml")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--boot-timeout-s", type=float, default=900.0)
    args = parser.parse_args()

    state = Path(tempfile.mkdtemp(prefix="soak-"))
    wall_start = time.time()
    proc, base = start_gateway_run(args.config, state)
    sampler = Sampler(proc.pid)
    sampler.start()
    try:
        wait_ready(proc, state / "gateway-run.log", args.boot_timeout_s)
        key = mint_key(f"sqlite:///{state / 'gateway.db'}")
        tally = Tally()
        until = time.monotonic() + args.minutes * 60

        async def clients() -> None:
            await asyncio.gather(
                *(_client(base, key, until, s + 1, tally) for s in range(args.workers))
            )

        asyncio.run(clients())
        _report(tally, args.minutes)
        problems = _settled_ledger(state / "gateway.db", tally)
        print("ledger == client-visible usage, per model" if not problems else "ledger differs:")
        for line in problems:
            print(f"    {line}")
        print(f"stack at the end (machine used {machine_used() / GiB:.2f} GiB):")
        print(table(sampler.snapshot()))
        kills = oom_kills(wall_start)
        print(
            f"peak: stack {sampler.peak_stack / GiB:.2f} GiB PSS at {sampler.peak_at:.0f} s, "
            f"machine used {sampler.peak_used / GiB:.2f} GiB; Ray OOM kills: {kills}"
        )
        print(f"gateway run log: {state / 'gateway-run.log'}")
        return 1 if tally.errors or problems or kills else 0
    finally:
        sampler.stop()
        stop_gateway_run(proc)


if __name__ == "__main__":
    sys.exit(main())
