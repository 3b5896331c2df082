"""bench/prefix_routing.py without a stack: its config, its traces' shape, its arithmetic."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench import prefix_routing as bench
from serve_app.config import GatewayAppArgs

LOCKSTEP = ["--stagger-s", "0", "--think-s", "0"]
"""No pauses: the traces' shape without their schedule (the default pauses seconds)."""


def test_two_deployments_alike_but_for_routing(tmp_path: Path) -> None:
    args = bench.parse_args(["--kv-mib", "512"])
    config = yaml.safe_load(bench.write_config(tmp_path / "g.yaml", args).read_text())
    catalog = GatewayAppArgs.model_validate(config["applications"][0]["args"]).catalog
    assert [m.id for m in catalog] == list(bench.MODES.values())
    assert [m.routing for m in catalog] == list(bench.MODES)
    for model in catalog:
        assert model.deployment.num_replicas == 2
        assert "lora" not in model.engine.config and not model.adapters
        assert model.engine.config["kv_cache_memory_bytes"] == 512 * 1024**2
        assert model.deployment.routing_imbalance == 8  # the catalog's default
    tuned = bench.parse_args(["--imbalance", "8"])
    config = yaml.safe_load(bench.write_config(tmp_path / "t.yaml", tuned).read_text())
    prefix, pow2 = GatewayAppArgs.model_validate(config["applications"][0]["args"]).catalog
    assert (prefix.deployment.routing_imbalance, prefix.routing) == (8, "prefix")
    assert pow2.routing == "pow2"


def _server(seen: list[list[dict[str, str]]]) -> httpx.MockTransport:
    """A chat server streaming one answer and usage (prompt tokens: the characters sent)."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body["messages"])
        size = sum(len(m["content"]) for m in body["messages"])
        chunks: list[dict[str, Any]] = [
            {"choices": [{"delta": {"content": "ok"}}]},
            {
                "choices": [],
                "usage": {
                    "prompt_tokens": size,
                    "completion_tokens": 1,
                    "prompt_tokens_details": {"cached_tokens": size // 2},
                },
            },
        ]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler)


def test_sessions_resend_a_growing_history_of_their_own() -> None:
    args = bench.parse_args(["--sessions", "3", "--turns", "4", *LOCKSTEP])
    seen: list[list[dict[str, str]]] = []

    async def run() -> list[bench.Turn]:
        async with httpx.AsyncClient(transport=_server(seen), base_url="http://x") as client:
            return (await bench.agent_trace(client, "m", 0, args))[0]

    turns = asyncio.run(run())
    assert len(turns) == 12 and all(t.cached_tokens == t.prompt_tokens // 2 for t in turns)
    systems = {m[0]["content"] for m in seen}
    assert len(systems) == 3  # each session its own system prompt
    for system in systems:
        history = sorted((m for m in seen if m[0]["content"] == system), key=len)
        assert [len(h) for h in history] == [2, 4, 6, 8]
        for shorter, longer in itertools.pairwise(history):
            assert longer[: len(shorter)] == shorter  # the earlier turn is a prefix
            assert longer[len(shorter)] == {"role": "assistant", "content": "ok"}


def test_hit_rate_and_ratios() -> None:
    figures = {
        # A first turn (nothing reachable) and three later ones (960 tokens reachable each).
        "prefix": bench.ModeFigures(
            [bench.Turn(2.0, 1000, 0, 16)] + [bench.Turn(0.1, 1000, 900, 16, 960)] * 3, 2.0
        ).summary(),
        "pow2": bench.ModeFigures(
            [bench.Turn(2.0, 1000, 0, 16)] + [bench.Turn(0.4, 1000, 300, 16, 960)] * 3, 4.0
        ).summary(),
    }
    compared = bench._compare(figures)
    assert figures["prefix"]["hit_rate"] == 0.675 and figures["pow2"]["tokens_per_s"] == 16.0
    assert figures["prefix"]["reachable_hit_rate"] == 0.72
    assert figures["prefix"]["affinity"] == 0.938  # 2,700 of 2,880 reachable
    assert compared["prefix_over_pow2"] == {
        "ttft_p50_ms": 0.25,
        "ttft_p95_ms": 1.0,  # the first turns, alike
        "ttft_p50_later_turns_ms": 0.25,
        "tokens_per_s": 2.0,
        "hit_rate": 3.0,
        "affinity": 3.006,  # 0.938 / 0.312 (900 and 300 of 960, rounded)
    }


def test_both_modes_replay_the_same_starts_and_tool_pauses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The schedule is seeded apart from the text: the same seed, the same pauses (so the
    modes meet the same load), and different seeds (rounds) different ones."""
    args = bench.parse_args(
        ["--sessions", "2", "--turns", "3", "--stagger-s", "10", "--think-s", "2"]
    )
    pauses: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        pauses.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(bench.asyncio, "sleep", sleep)

    def schedule(seed: int) -> list[float]:
        pauses.clear()

        async def run() -> None:
            async with httpx.AsyncClient(transport=_server([]), base_url="http://x") as client:
                await bench.agent_trace(client, "m", seed, args)

        asyncio.run(run())
        return sorted(pauses)

    first = schedule(7)
    assert len(first) == 2 + 2 * 2  # a start per session, a pause before turns 2 and 3
    assert sum(p <= 10 for p in first) >= 2 and all(p >= 0 for p in first)
    assert schedule(7) == first and schedule(8) != first


def test_reachable_tokens_count_whole_blocks_of_the_engines_size() -> None:
    args = bench.parse_args(["--sessions", "1", "--turns", "2", "--block-tokens", "32", *LOCKSTEP])

    async def run() -> list[bench.Turn]:
        async with httpx.AsyncClient(transport=_server([]), base_url="http://x") as client:
            return (await bench.agent_trace(client, "m", 0, args))[0]

    first, second = asyncio.run(run())
    assert first.reachable_tokens == 0
    assert second.reachable_tokens == first.prompt_tokens // 32 * 32
    assert bench.block_tokens(bench.parse_args(["--block-tokens", "64"])) == 64
    config = bench.engine_settings(args)
    assert config["engine_args"] == {"block_size": 32}
