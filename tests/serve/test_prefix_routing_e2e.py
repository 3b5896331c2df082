"""The prefix router inside Ray Serve: loaded from ``request_router_config``, its tree actor
shared, conversations kept on one replica, and a killed replica gone from the tree.

A probe deployment answers with its replica's id instead of generating, so the test sees
each routing decision without an engine; it takes the chat head's ``HeadRequest`` and the
router exactly as ``serve_app.builders`` configures it for a chat model. It starts its own
Ray unless one runs already (the other tests' stack), and removes its app either way.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray import serve
from ray.serve._private.constants import SERVE_NAMESPACE
from ray.serve.config import RequestRouterConfig

from deployments.chat.prefix_router import ROUTER_CLASS, router_kwargs
from serve_app.contract.chat import HeadRequest, PromptSpec, SamplingSpec

APP = "prefix-probe"


@serve.deployment(
    num_replicas=2,
    max_ongoing_requests=8,
    ray_actor_options={"num_cpus": 0},
    request_router_config=RequestRouterConfig(
        **{"request_router_class": ROUTER_CLASS, "request_router_kwargs": router_kwargs(4, 10**5)}
    ),
)
class Probe:
    async def generate(self, request: HeadRequest) -> str:
        return str(serve.get_replica_context().replica_id.unique_id)


def turn(session: int, n: int) -> HeadRequest:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"Session {session} agent. " + "Rules. " * 200}
    ]
    for i in range(n):
        messages += [
            {"role": "user", "content": f"step {i}"},
            {"role": "assistant", "content": f"done {i}"},
        ]
    return HeadRequest(
        request_id=f"chatcmpl-{session}-{n}",
        prompts=[PromptSpec(kind="chat", messages=messages)],
        sampling=SamplingSpec(max_tokens=1),
        max_tokens=1,
        max_tokens_param="max_tokens",
        max_output_tokens=1,
        org_id="org_e2e",
    )


@pytest.fixture(scope="module")
def probe() -> Iterator[Any]:
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.run(Probe.bind(), name=APP, route_prefix=None)
    yield serve.get_app_handle(APP)
    serve.delete(APP)
    if started:
        serve.shutdown()
        ray.shutdown()


def tree_tenants() -> list[str]:
    tree = ray.get_actor("ChatPrefixTreeActor", namespace=f"{SERVE_NAMESPACE}::{APP}::Probe")
    tenants: list[str] = ray.get(tree.tenants.remote())
    return tenants


def test_conversations_stay_and_a_killed_replica_leaves(probe: Any) -> None:
    placed = {s: probe.generate.remote(turn(s, 0)).result() for s in range(4)}
    assert len(set(placed.values())) == 2, placed  # new conversations spread
    for n in range(1, 4):
        for s in range(4):
            assert probe.generate.remote(turn(s, n)).result() == placed[s], (s, n)
    victim = placed[0]
    [name] = [t for t in tree_tenants() if t.endswith(f"#{victim}")]
    ray.kill(ray.get_actor(name, namespace=SERVE_NAMESPACE), no_restart=True)
    deadline = time.monotonic() + 60
    while name in tree_tenants():
        assert time.monotonic() < deadline, "the dead replica's entries stayed"
        time.sleep(0.5)
    answered = []
    for n in range(4, 8):
        try:
            answered.append(probe.generate.remote(turn(0, n)).result(timeout_s=30))
        except Exception:  # the one request that may still have been sent before it died
            continue
    assert len(answered) >= 3 and victim not in answered, answered
