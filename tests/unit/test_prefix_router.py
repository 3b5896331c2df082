"""The chat heads' prefix router (deployments/chat/prefix_router.py): its text, its
namespaces, its choice among fake replicas, and its clean-up of dead ones.

The router under test is Ray's real ``PrefixCacheAffinityRouter`` with its one decision
replaced (where a request goes) and Ray's real ``PrefixTree``; only the tree's actor is
replaced by the same tree in process (``LocalTree``) so no Ray cluster starts, and Ray's
own ``FakeRunningReplica`` stands in for replicas.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest
from ray.llm._internal.serve.routing_policies.prefix_aware import prefix_aware_router
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTree
from ray.serve._private.common import DeploymentHandleSource, RequestMetadata
from ray.serve._private.test_utils import FAKE_REPLICA_DEPLOYMENT_ID, FakeRunningReplica
from ray.serve.request_router import PendingRequest

from deployments.chat.prefix_router import (
    ChatPrefixRouter,
    FastPrefixTree,
    namespace,
    prompt_text,
    router_kwargs,
    routing_text,
)
from serve_app.contract.adapters import AdapterRef
from serve_app.contract.chat import HeadRequest, PromptSpec, SamplingSpec
from tests.fixtures.gateway import GatewayHarness
from tests.fixtures.prefix_tree import LocalTree, NoRay

SYSTEM = "You are a careful agent. " * 40


def chat_request(
    messages: list[dict[str, Any]],
    org: str | None = "org_a",
    adapter: AdapterRef | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> HeadRequest:
    return HeadRequest(
        request_id="chatcmpl-1",
        prompts=[PromptSpec(kind="chat", messages=messages, tools=tools)],
        sampling=SamplingSpec(max_tokens=8),
        max_tokens=8,
        max_tokens_param="max_tokens",
        max_output_tokens=8,
        adapter=adapter,
        org_id=org,
    )


def turn(n: int, org: str = "org_a", adapter: AdapterRef | None = None) -> HeadRequest:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i in range(n):
        messages.append({"role": "user", "content": f"question {i} about the plan"})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    return chat_request(messages, org=org, adapter=adapter)


def pending(request: Any, model_id: str = "") -> PendingRequest:
    meta = RequestMetadata(request_id="r", internal_request_id="r", multiplexed_model_id=model_id)
    return PendingRequest(args=[request], kwargs={}, metadata=meta)


@pytest.fixture
def make_router(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(prefix_aware_router, "ray", NoRay)
    loop = asyncio.new_event_loop()
    # The router asks for the thread's current loop when built; an earlier test's
    # ``asyncio.run`` leaves the main thread with none.
    asyncio.set_event_loop(loop)

    def make(
        queues: dict[str, int], imbalance: int = 4
    ) -> tuple[ChatPrefixRouter, dict[str, FakeRunningReplica]]:
        router = ChatPrefixRouter(
            deployment_id=FAKE_REPLICA_DEPLOYMENT_ID,
            handle_source=DeploymentHandleSource.UNKNOWN,
        )
        kwargs = router_kwargs(imbalance, 100_000) | {"do_eviction": False}
        router.initialize_state(**kwargs, tree_actor=LocalTree())
        router._lazily_fetched_loop = loop  # the router's background probes run on it
        replicas = {}
        for name, queue in queues.items():
            replicas[name] = FakeRunningReplica(name)
            replicas[name].set_queue_len_response(queue)
        router.update_replicas(list(replicas.values()))
        return router, replicas

    yield make
    loop.run_until_complete(_cancel_pending())
    asyncio.set_event_loop(None)
    loop.close()


async def _cancel_pending() -> None:
    """End the router's background queue probes before their loop closes."""
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def choose(router: ChatPrefixRouter, request: HeadRequest) -> set[str]:
    """The replicas the router would try first for ``request`` (its top rank)."""
    ranks = router._event_loop.run_until_complete(
        router.choose_replicas(list(router._replicas.values()), pending(request))
    )
    return {r.replica_id.unique_id for r in ranks[0]}


def routed(router: ChatPrefixRouter, request: HeadRequest, replica: FakeRunningReplica) -> None:
    router.on_request_routed(pending(request), replica.replica_id, None)  # type: ignore[arg-type]


def tree_of(router: ChatPrefixRouter) -> PrefixTree:
    tree: PrefixTree = router._tree_actor.tree
    return tree


# --- the text -------------------------------------------------------------------------


def test_text_keeps_message_order_roles_and_tools_so_a_next_turn_extends_it() -> None:
    first, second = turn(1), turn(2)
    assert routing_text(second).startswith(routing_text(first))
    swapped = chat_request([{"role": "assistant", "content": SYSTEM}])
    assert routing_text(swapped) != routing_text(
        chat_request([{"role": "system", "content": SYSTEM}])
    )
    tool = {"type": "function", "function": {"name": "search", "parameters": {}}}
    with_tools = chat_request([{"role": "user", "content": "hi"}], tools=[tool])
    assert "search" in routing_text(with_tools).split("user:")[0]


def test_text_parts_and_images_and_completions() -> None:
    parts = [
        {"type": "text", "text": "look at "},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    text = prompt_text(PromptSpec(kind="chat", messages=[{"role": "user", "content": parts}]))
    assert text.startswith("user:look at ") and "AAAA" in text
    other = [parts[0], {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}}]
    assert (
        prompt_text(PromptSpec(kind="chat", messages=[{"role": "user", "content": other}])) != text
    )
    assert prompt_text(PromptSpec(kind="completion", prompt="Once upon")) == "Once upon"
    assert prompt_text(PromptSpec(kind="completion", token_ids=[5, 6])) == "5 6"


def test_namespace_separates_orgs_and_adapters_and_hides_the_ids() -> None:
    ref = AdapterRef(key="ad_1", model_id="smol:pirate")
    spaces = {
        namespace(turn(1, org="org_a")),
        namespace(turn(1, org="org_b")),
        namespace(turn(1, org="org_a", adapter=ref)),
    }
    assert len(spaces) == 3
    assert all("org_" not in s and "pirate" not in s for s in spaces)
    assert namespace(turn(1)) == namespace(turn(3))


# --- the choice -----------------------------------------------------------------------


def test_a_conversation_follows_its_prefix(make_router: Any) -> None:
    router, replicas = make_router({"r1": 0, "r2": 0})
    routed(router, turn(1), replicas["r2"])
    assert choose(router, turn(2)) == {"r2"}
    routed(router, turn(1, org="org_x"), replicas["r1"])
    assert choose(router, turn(3, org="org_x")) == {"r1"}


def test_another_org_never_matches_an_orgs_prefix(make_router: Any) -> None:
    router, replicas = make_router({"r1": 0, "r2": 0})
    routed(router, turn(1, org="org_a"), replicas["r2"])
    routed(router, turn(1, org="org_b"), replicas["r1"])
    # Same text: each org follows only where its own requests went.
    assert choose(router, turn(2, org="org_b")) == {"r1"}
    assert choose(router, turn(2, org="org_a")) == {"r2"}
    # org_b's requests are never matched against org_a's entries in the tree.
    match, _ = tree_of(router).prefix_match(routing_text(turn(2, org="org_b")), None)
    assert match.startswith(namespace(turn(1, org="org_b")))


def test_base_and_adapter_requests_do_not_share_prefixes(make_router: Any) -> None:
    router, replicas = make_router({"r1": 0, "r2": 0})
    ref = AdapterRef(key="ad_1", model_id="smol:pirate")
    routed(router, turn(1), replicas["r2"])
    routed(router, turn(1, adapter=ref), replicas["r1"])
    assert choose(router, turn(2, adapter=ref)) == {"r1"}
    assert choose(router, turn(2)) == {"r2"}


def test_an_overloaded_affinity_replica_loses(make_router: Any) -> None:
    router, replicas = make_router({"r1": 0, "r2": 9}, imbalance=4)
    routed(router, turn(1), replicas["r2"])
    # The holder's queue is longer than the shortest by more than the margin: the least
    # loaded replica wins.
    assert choose(router, turn(2)) == {"r1"}
    balanced, replicas = make_router({"r1": 0, "r2": 4}, imbalance=4)
    routed(balanced, turn(1), replicas["r2"])
    assert choose(balanced, turn(2)) == {"r2"}


def test_the_margin_is_measured_on_the_holders_queue(make_router: Any) -> None:
    # Ray's router drops the prefix whenever any two queues differ by more than the margin;
    # here the holder is the short one, so its prefix still wins.
    router, replicas = make_router({"r1": 0, "r2": 9}, imbalance=4)
    routed(router, turn(1), replicas["r1"])
    assert choose(router, turn(2)) == {"r1"}


def first_choices(router: ChatPrefixRouter, requests: list[HeadRequest]) -> list[str]:
    """The replica Serve would send each request to (the least loaded of the router's first
    rank, ties to the first listed), requests taken one after another."""
    chosen = []
    for request in requests:
        ranks: Any = router._event_loop.run_until_complete(
            router.choose_replicas(list(router._replicas.values()), pending(request))
        )
        replica = router._event_loop.run_until_complete(
            router._select_from_candidate_replicas(ranks[0], 0)
        )
        assert replica is not None
        chosen.append(replica.replica_id.unique_id)
    return chosen


def new_conversation(i: int) -> HeadRequest:
    system = f"You are agent {i}. " + "Answer briefly and call tools as JSON. " * 30
    return chat_request([{"role": "system", "content": system}, {"role": "user", "content": "hi"}])


def test_a_burst_of_new_conversations_spreads_evenly(make_router: Any) -> None:
    # Equal queues (the burst is routed before any answer moves them) and a tree that has
    # already seen r1 more: Ray's rule (least remembered text) would send all to r2.
    router, replicas = make_router({"r1": 0, "r2": 0})
    routed(router, turn(4), replicas["r1"])
    chosen = first_choices(router, [new_conversation(i) for i in range(8)])
    assert chosen.count("r1") == chosen.count("r2") == 4


def test_a_new_conversation_goes_to_the_shortest_queue(make_router: Any) -> None:
    router, replicas = make_router({"r1": 3, "r2": 0, "r3": 1})
    router._replica_queue_len_cache.update(replicas["r1"].replica_id, 3)
    router._replica_queue_len_cache.update(replicas["r2"].replica_id, 0)
    router._replica_queue_len_cache.update(replicas["r3"].replica_id, 1)
    assert first_choices(router, [new_conversation(i) for i in range(3)]) == ["r2"] * 3


def test_a_turn_routed_by_another_gateway_replica_is_found_through_the_shared_tree(
    make_router: Any,
) -> None:
    one, replicas = make_router({"r1": 0, "r2": 0})
    other, _ = make_router({"r1": 0, "r2": 0})
    other._tree_actor = one._tree_actor  # the deployment's one shared tree
    routed(one, turn(1), replicas["r2"])
    assert choose(other, turn(2)) == {"r2"}  # not in ``other``'s own copy: asked the actor
    # A later turn through the same router is matched in its own copy, without the actor.
    routed(other, turn(2), replicas["r2"])
    other._tree_actor = None  # would raise if asked
    assert choose(other, turn(3)) == {"r2"}


def test_a_router_alone_does_not_ask_the_shared_tree_until_another_records(
    make_router: Any,
) -> None:
    router, replicas = make_router({"r1": 0, "r2": 0})
    shared = router._tree_actor
    routed(router, turn(1), replicas["r2"])  # the shared tree answers: one router records
    router._tree_actor = None  # would raise if asked
    assert len(choose(router, new_conversation(1))) == 1  # decided from its own copy
    other, _ = make_router({"r1": 0, "r2": 0})
    other._tree_actor = shared
    routed(other, turn(1, org="org_b"), replicas["r1"])
    router._tree_actor = shared
    routed(router, turn(2), replicas["r2"])  # this record's answer: two routers now
    assert router._alone is False
    routed(other, new_conversation(7), replicas["r1"])
    assert choose(router, new_conversation(7)) == {"r1"}  # known only to the shared tree


def test_the_routers_own_copy_forgets_its_oldest_text_as_the_shared_tree_does(
    make_router: Any,
) -> None:
    router, replicas = make_router({"r1": 0, "r2": 0})
    # The catalog's eviction settings, as the builder passes them, on a 5,000-character bound.
    kwargs = router_kwargs(4, 5_000) | {"eviction_interval_secs": 0.01}
    router.initialize_state(**kwargs, tree_actor=router._tree_actor)
    router.update_replicas(list(replicas.values()))
    local = router._local
    r1 = replicas["r1"].replica_id.to_full_id_str()
    try:
        for i in range(6):  # ~1,200 characters each
            routed(router, new_conversation(i), replicas["r1"])
        wait_for(lambda: local.tenant_to_char_count[r1] <= 4_500)
        assert choose(router, new_conversation(5)) == {"r1"}  # the newest text is kept
    finally:
        local.stop_eviction_loop()
        tree_of(router).stop_eviction_loop()


def wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_dead_replica_leaves_the_tree(make_router: Any) -> None:
    router, replicas = make_router({"r1": 0, "r2": 0})
    routed(router, turn(1), replicas["r2"])
    r2 = replicas["r2"].replica_id.to_full_id_str()
    assert r2 in tree_of(router).tenant_to_char_count
    router.on_replica_actor_died(replicas["r2"].replica_id)
    assert r2 not in tree_of(router).tenant_to_char_count
    assert r2 not in router._local.tenant_to_char_count
    assert choose(router, turn(2)) <= {"r1"}


def test_a_removed_replica_leaves_the_tree(make_router: Any) -> None:
    router, replicas = make_router({"r1": 0, "r2": 0, "r3": 0})
    routed(router, turn(1), replicas["r3"])
    router.update_replicas([replicas["r1"], replicas["r2"]])  # scaled down
    r3 = replicas["r3"].replica_id.to_full_id_str()
    assert r3 not in tree_of(router).tenant_to_char_count
    assert r3 not in router._local.tenant_to_char_count
    assert "r3" not in choose(router, turn(2))


def test_calls_that_carry_no_head_request_fall_back(make_router: Any) -> None:
    router, replicas = make_router({"r1": 0, "r2": 0})
    ranks = router._event_loop.run_until_complete(
        router.choose_replicas(list(replicas.values()), pending("adapter-key"))
    )
    assert {r.replica_id.unique_id for r in ranks[0]} <= {"r1", "r2"}
    router.on_request_routed(pending("adapter-key"), replicas["r1"].replica_id, None)  # type: ignore[arg-type]
    assert tree_of(router).tenant_to_char_count[replicas["r1"].replica_id.to_full_id_str()] == 0


def test_the_fast_shared_prefix_count_agrees_with_rays() -> None:
    rng = random.Random(3)
    for _ in range(500):
        a = "".join(rng.choice("ab") for _ in range(rng.randint(0, 40)))
        b = a[: rng.randint(0, len(a))] + "".join(
            rng.choice("ab") for _ in range(rng.randint(0, 9))
        )
        expected = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        assert FastPrefixTree._shared_prefix_count(a, b) == expected, (a, b)
        assert PrefixTree._shared_prefix_count(a, b) == expected


# --- the gateway names the caller ---------------------------------------------------


async def test_every_head_request_carries_the_callers_organization(
    gateway: GatewayHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chat, completions and responses all reach the head with the caller's org (the
    router's namespace); a request without it would share one namespace across orgs."""
    head = gateway.app.state.gateway.text.heads["scripted-chat"]
    seen: list[HeadRequest] = []
    original = head.stream

    def recording(request: HeadRequest) -> Any:
        seen.append(request)
        return original(request)

    monkeypatch.setattr(head, "stream", recording)
    client = gateway.openai(gateway.keys["user"])
    messages: Any = [{"role": "user", "content": "hi"}]
    await client.chat.completions.create(model="scripted-chat", messages=messages)
    await client.completions.create(model="scripted-chat", prompt="say something")
    await client.responses.create(model="scripted-chat", input="hi there")
    other = gateway.openai(gateway.keys["external"])
    await other.chat.completions.create(model="scripted-chat", messages=messages)
    acme, ext = gateway.store.get_org("acme"), gateway.store.get_org("ext-org")
    assert acme is not None and ext is not None and acme.id != ext.id
    assert [r.org_id for r in seen] == [acme.id] * 3 + [ext.id]
