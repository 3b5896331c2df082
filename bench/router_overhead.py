"""What the chat heads' prefix router adds per request (issue 43 item 6).

Times the router's own path for one request -- ``choose_replicas`` (queue probe of the
candidates, prefix match, fallback) plus ``on_request_routed`` (the tree insert) -- on
realistic agent prompts (~1,000-token system prompt and tool list, history growing each
turn, many sessions and organizations), against the same path of Serve's default
power-of-two router, with fake replicas answering their queue length at once.

``--tree actor`` (default) uses Ray's detached ``PrefixTreeActor`` exactly as deployed
(a local Ray starts: run it under ``flock /tmp/heavy.lock``); ``--tree local`` puts the
same tree in process, which shows how much of the cost is the actor round trips.

    flock /tmp/heavy.lock env PYTHONPATH=$PWD .venv/bin/python bench/router_overhead.py
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.fixtures

from ray.llm._internal.serve.routing_policies.prefix_aware import prefix_aware_router
from ray.serve._private.common import DeploymentHandleSource, RequestMetadata
from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from ray.serve._private.test_utils import FAKE_REPLICA_DEPLOYMENT_ID, FakeRunningReplica
from ray.serve.request_router import PendingRequest

from deployments.chat.prefix_router import (
    ChatPrefixRouter,
    FastPrefixTreeActor,
    router_kwargs,
    routing_text,
)
from serve_app.contract.chat import HeadRequest, PromptSpec, SamplingSpec
from tests.fixtures.prefix_tree import LocalTree, NoRay

WORDS = [
    "plan",
    "search",
    "file",
    "query",
    "result",
    "agent",
    "tool",
    "table",
    "order",
    "user",
    "schema",
    "value",
]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def agent_requests(sessions: int, turns: int, seed: int = 7) -> list[HeadRequest]:
    """Interleaved turns of ``sessions`` agent conversations (~750 words of system prompt
    and tools each, ~60 words more per turn), each session its own organization of 8."""
    rng = random.Random(seed)
    states = []
    for s in range(sessions):
        tools = [
            {
                "type": "function",
                "function": {"name": f"tool_{s}_{i}", "description": _words(rng, 40)},
            }
            for i in range(6)
        ]
        system = {"role": "system", "content": _words(rng, 500)}
        states.append((f"org_{s % 8}", tools, [system]))
    requests = []
    for t in range(turns):
        for s, (org, tools, messages) in enumerate(states):
            messages.append({"role": "user", "content": _words(rng, 30)})
            prompt = PromptSpec(kind="chat", messages=list(messages), tools=tools)
            requests.append(
                HeadRequest(
                    request_id=f"chatcmpl-{s}-{t}",
                    prompts=[prompt],
                    sampling=SamplingSpec(max_tokens=64),
                    max_tokens=64,
                    max_tokens_param="max_tokens",
                    max_output_tokens=64,
                    org_id=org,
                )
            )
            messages.append({"role": "assistant", "content": _words(rng, 30)})
    return requests


def _pending(request: HeadRequest) -> PendingRequest:
    meta = RequestMetadata(request_id=request.request_id, internal_request_id="r")
    return PendingRequest(args=[request], kwargs={}, metadata=meta)


def make_router(kind: str, tree: str, replicas: list[FakeRunningReplica]) -> Any:
    cls = PowerOfTwoChoicesRequestRouter if kind == "pow2" else ChatPrefixRouter
    router = cls(
        deployment_id=FAKE_REPLICA_DEPLOYMENT_ID,
        handle_source=DeploymentHandleSource.UNKNOWN,
        use_replica_queue_len_cache=True,
    )
    if kind == "prefix":
        tree_actor = None
        if tree == "local":
            prefix_aware_router.ray = NoRay  # type: ignore[assignment]
            tree_actor: Any = LocalTree()
        else:
            tree_actor = FastPrefixTreeActor.remote()
        router.initialize_state(**router_kwargs(4, 2_000_000), tree_actor=tree_actor)
    router.update_replicas(replicas)
    return router


async def time_router(router: Any, requests: list[HeadRequest]) -> list[tuple[float, float]]:
    """Seconds per request of (choose, record), the replicas' queue cache kept warm."""
    costs = []
    replicas = list(router._replicas.values())
    for request in requests:
        for r in replicas:
            router._replica_queue_len_cache.update(r.replica_id, 0)
        pending = _pending(request)
        start = time.perf_counter()
        ranks = await router.choose_replicas(replicas, pending)
        chosen = ranks[0][0] if ranks and ranks[0] else replicas[0]
        middle = time.perf_counter()
        router.on_request_routed(pending, chosen.replica_id, None)
        costs.append((middle - start, time.perf_counter() - middle))
    return costs


async def run(
    kind: str, tree: str, n: int, requests: list[HeadRequest]
) -> list[tuple[float, float]]:
    replicas = []
    for i in range(n):
        replicas.append(FakeRunningReplica(f"r{i}"))
        replicas[-1].set_queue_len_response(0)
    return await time_router(make_router(kind, tree, replicas), requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", choices=["actor", "local"], default="actor")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=6)
    args = parser.parse_args()
    if args.tree == "actor":
        import ray

        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    requests = agent_requests(args.sessions, args.turns)
    chars = statistics.median(len(routing_text(r)) for r in requests)
    print(f"{len(requests)} requests, median prompt {chars:.0f} chars, tree={args.tree}")
    for kind in ("pow2", "prefix"):
        costs = asyncio.run(run(kind, args.tree, args.replicas, requests))
        line = [kind.ljust(6)]
        for name, part in (("choose", 0), ("record", 1), ("total", None)):
            values = sorted(c[0] + c[1] if part is None else c[part] for c in costs)
            p50, p99 = values[len(values) // 2], values[int(len(values) * 0.99)]
            line.append(f"{name} p50 {p50 * 1e3:.3f} ms p99 {p99 * 1e3:.3f} ms")
        print("  ".join(line))


if __name__ == "__main__":
    main()
