"""The memory budget keeper's choices (serve_app/heads/budget.py), without Ray."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from serve_app.heads.budget import (
    BudgetHead,
    BudgetKeeper,
    KeeperTiming,
    Verdict,
    budget_heads,
    honour_pins,
    plan_room,
)

HEADS = {
    "chat": BudgetHead("chat", 2.5, evictable=False),  # pinned
    "tools": BudgetHead("tools", 6.0, evictable=True),
    "vision": BudgetHead("vision", 3.0, evictable=True),
    "embed": BudgetHead("embed", 1.5, evictable=True),
    "speech": BudgetHead("speech", 0.5, evictable=True),
}


def test_fits_wakes_without_evicting() -> None:
    decision = plan_room("tools", HEADS, {"chat", "embed"}, (), {}, budget_gib=12)
    assert decision.verdict is Verdict.WAKE and decision.evict == ()
    assert decision.awake_gib == 4.0 and decision.needed_gib == 6.0


def test_least_recently_used_idle_heads_go_first() -> None:
    awake = {"chat", "vision", "embed", "speech"}
    uses = {"vision": 30.0, "embed": 10.0, "speech": 20.0}
    # 2.5 + 3 + 1.5 + 0.5 = 7.5 awake; tools needs 6 under 10: free 3.5 -> embed (oldest),
    # speech (next), then vision
    decision = plan_room("tools", HEADS, awake, (), uses, budget_gib=10)
    assert decision.verdict is Verdict.MAKE_ROOM
    assert decision.evict == ("embed", "speech", "vision")
    uses = {"vision": 5.0, "embed": 10.0, "speech": 20.0}
    decision = plan_room("tools", HEADS, awake, (), uses, budget_gib=10)
    assert decision.evict == ("vision", "embed")  # 7.5 - 3 - 1.5 + 6 = 9 <= 10


def test_busy_head_is_never_chosen() -> None:
    awake = {"chat", "vision", "embed"}
    uses = {"vision": 1.0, "embed": 2.0}
    decision = plan_room("tools", HEADS, awake, {"vision"}, uses, budget_gib=10)
    # 7 awake + 6 = 13; embed frees 1.5 -> 11.5 > 10: vision is busy, so no room at all
    assert decision.verdict is Verdict.NO_ROOM and decision.evict == ()
    decision = plan_room("tools", HEADS, awake, {"vision"}, uses, budget_gib=12)
    assert decision.evict == ("embed",)


def test_pinned_never_chosen_and_nothing_freeable_is_no_room() -> None:
    decision = plan_room("tools", HEADS, {"chat"}, (), {}, budget_gib=7)
    assert decision.verdict is Verdict.NO_ROOM
    decision = plan_room("tools", HEADS, {"chat", "speech"}, (), {}, budget_gib=8.6)
    assert decision.verdict is Verdict.MAKE_ROOM and decision.evict == ("speech",)


def test_dedicated_endpoints_are_outside_the_catalog_budget() -> None:
    # a dedicated endpoint's deployment is not a catalog head: never a candidate, never counted
    decision = plan_room("tools", HEADS, {"chat", "ded-acme-head"}, (), {}, budget_gib=9)
    assert decision.verdict is Verdict.WAKE


class Orders:
    def __init__(self) -> None:
        self.ordered: list[tuple[str, str]] = []
        self.cleared: list[str] = []

    def order(self, model_id: str, for_model: str) -> None:
        self.ordered.append((model_id, for_model))

    def clear(self, model_id: str) -> None:
        self.cleared.append(model_id)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


class Serve:
    """Takes an ordered head down after ``delay`` polls, unless it is ``refusing``."""

    def __init__(self, awake: Iterable[str], orders: Orders, refusing: Iterable[str] = ()):
        self.awake = set(awake)
        self.orders = orders
        self.refusing = set(refusing)

    def __call__(self) -> set[str]:
        for model_id, _ in self.orders.ordered:
            if model_id not in self.refusing:
                self.awake.discard(model_id)
        return set(self.awake)


class Lease:
    """One shared row: ``holder`` or nobody."""

    holder: str | None = None

    def __init__(self, name: str) -> None:
        self.name = name
        self.acquired = 0

    def acquire(self) -> bool:
        if Lease.holder in (None, self.name):
            Lease.holder = self.name
            self.acquired += 1
            return True
        return False

    def release(self) -> None:
        if Lease.holder == self.name:
            Lease.holder = None


def keeper(
    serve: Serve,
    orders: Orders,
    clock: Clock,
    budget: float,
    lease: Lease | None = None,
    heads: dict[str, BudgetHead] | None = None,
) -> BudgetKeeper:
    return BudgetKeeper(
        HEADS if heads is None else heads,
        budget,
        serve,
        orders,
        lease,
        clock=clock,
        sleep=clock.sleep,
        timing=KeeperTiming(poll_s=1, deadline_s=60, refused_after_s=10, recent_use_s=5),
    )


def test_keeper_orders_sleep_waits_then_wakes() -> None:
    orders, clock = Orders(), Clock()
    serve = Serve({"chat", "vision", "embed"}, orders)
    k = keeper(serve, orders, clock, budget=10)
    k.note_use("vision")
    clock.now += 60
    k.note_use("embed")
    clock.now += 60
    assert asyncio.run(k.make_room("tools"))
    assert orders.ordered == [("vision", "tools")]  # 7 - 3 + 6 = 10: vision alone suffices
    assert orders.cleared == ["tools"]  # no stale order keeps the woken head down


def test_keeper_skips_a_head_that_refuses_and_takes_the_next() -> None:
    orders, clock = Orders(), Clock()
    serve = Serve({"chat", "vision", "embed", "speech"}, orders, refusing={"vision"})
    k = keeper(serve, orders, clock, budget=12)  # 7.5 awake + 6: one of vision or embed
    for model in ("vision", "embed", "speech"):
        k.note_use(model)
        clock.now += 60
    assert asyncio.run(k.make_room("tools"))
    assert [m for m, _ in orders.ordered] == ["vision", "embed"]  # vision stayed up: busy
    assert serve.awake == {"chat", "vision", "speech"}


def test_a_head_in_use_is_waited_for_then_put_to_sleep() -> None:
    """The only head that could make room was just called: the keeper waits until it is
    idle (``recent_use_s``), then orders it to sleep; the caller does not have to come back
    to start the wake (it did, after a whole Retry-After: the tool model's first call on
    the 8G every-route run took 295 s and 4 503s)."""
    orders, clock = Orders(), Clock()
    serve = Serve({"chat", "vision"}, orders)
    k = keeper(serve, orders, clock, budget=9)
    k.note_use("vision")  # in use right now
    started = clock.now
    assert asyncio.run(k.make_room("tools"))
    assert orders.ordered == [("vision", "tools")]
    assert 5 <= clock.now - started < 10  # recent_use_s, then one poll


def test_nothing_freeable_even_when_idle_answers_false_at_once() -> None:
    orders, clock = Orders(), Clock()
    serve = Serve({"chat"}, orders)
    k = keeper(serve, orders, clock, budget=7)  # chat (2.5, never evicted) + tools 6
    started = clock.now
    assert not asyncio.run(k.make_room("tools"))
    assert orders.ordered == [] and clock.now == started


def test_one_decision_at_a_time_across_replicas() -> None:
    Lease.holder = "other-replica"
    orders, clock = Orders(), Clock()
    serve = Serve({"chat"}, orders)
    lease = Lease("me")
    k = keeper(serve, orders, clock, budget=12, lease=lease)
    assert not asyncio.run(k.make_room("tools"))  # the other replica never let go
    assert lease.acquired == 0 and orders.cleared == []
    Lease.holder = None
    assert asyncio.run(k.make_room("tools"))
    assert lease.acquired == 1 and Lease.holder is None  # released after the decision


def test_unknown_head_is_not_held_back() -> None:
    orders, clock = Orders(), Clock()
    k = keeper(Serve({"chat"}, orders), orders, clock, budget=1)
    assert asyncio.run(k.make_room("ded-acme"))


SHIPPED_FOOTPRINTS = {  # configs/catalog/local.yaml's memory_gib of the large heads
    "smollm2": BudgetHead("smollm2", 2.5, evictable=False, pinned=True),
    "qwen": BudgetHead("qwen", 6.2, evictable=True),
    "vision": BudgetHead("vision", 2.9, evictable=True),
    "reasoning": BudgetHead("reasoning", 2.2, evictable=True),
    "embed": BudgetHead("embed", 1.5, evictable=True),
}


def test_a_pin_is_honoured_only_while_it_fits_beside_the_largest_sleeping_head() -> None:
    kept = honour_pins(SHIPPED_FOOTPRINTS, 8.7)  # 2.5 + 6.2: just fits
    assert kept.kept == ("smollm2",) and kept.dropped == ()
    assert kept.largest is not None and kept.largest.model_id == "qwen"
    dropped = honour_pins(SHIPPED_FOOTPRINTS, 8.0)
    assert dropped.kept == () and dropped.dropped == ("smollm2",)
    # never-sleeping heads count first; pins are kept in catalog order while they fit
    heads = {
        "fixed": BudgetHead("fixed", 1.0, evictable=False),
        "a": BudgetHead("a", 1.0, evictable=False, pinned=True),
        "b": BudgetHead("b", 2.0, evictable=False, pinned=True),
        "big": BudgetHead("big", 4.0, evictable=True),
    }
    assert honour_pins(heads, 7.5).kept == ("a",)  # 1 + 1 + 4 = 6; + 2 = 8 > 7.5
    assert honour_pins(heads, 7.5).always_gib == 1.0


def test_under_a_small_budget_the_dropped_pin_is_evicted_for_the_tool_model() -> None:
    from dataclasses import replace

    heads = dict(SHIPPED_FOOTPRINTS)
    heads["smollm2"] = replace(heads["smollm2"], evictable=True)  # what budget_heads(.., 8) does
    orders, clock = Orders(), Clock()
    serve = Serve({"smollm2", "embed"}, orders)
    k = keeper(serve, orders, clock, budget=8, heads=heads)
    k.note_use("embed")
    clock.now += 60
    k.note_use("smollm2")  # used last, but 2.5 + 1.5 + 6.2 > 8 and 1.5 alone is not enough
    clock.now += 60
    assert asyncio.run(k.make_room("qwen"))
    assert orders.ordered == [("embed", "qwen"), ("smollm2", "qwen")]
    assert serve.awake == set()
    # and back: SmolLM2 (2.5) wakes beside nothing else awake but qwen (6.2): qwen goes
    serve.awake = {"qwen"}
    clock.now += 60
    assert asyncio.run(k.make_room("smollm2"))
    assert orders.ordered[-1] == ("qwen", "smollm2")


def test_under_the_default_budget_the_pin_holds() -> None:
    orders, clock = Orders(), Clock()
    serve = Serve({"smollm2", "vision", "reasoning"}, orders)
    k = keeper(serve, orders, clock, budget=11.8, heads=SHIPPED_FOOTPRINTS)
    clock.now += 60
    assert asyncio.run(k.make_room("qwen"))  # 2.5 + 2.9 + 2.2 + 6.2 = 13.8 > 11.8
    assert [m for m, _ in orders.ordered] == ["reasoning"]  # 11.6: enough
    k.note_use("qwen")
    clock.now += 60
    serve.awake = {"smollm2", "vision", "qwen"}
    assert asyncio.run(k.make_room("reasoning"))  # 11.6 + 2.2 > 11.8
    assert [m for m, _ in orders.ordered] == ["reasoning", "vision"]  # never smollm2
    assert serve.awake == {"smollm2", "qwen"}


def test_budget_heads_from_the_catalog() -> None:
    from serve_app.cli.serve_config import load_serve_config
    from serve_app.config import GatewayAppArgs

    config = load_serve_config("configs/local.yaml")
    app = next(a for a in config["applications"] if a.get("args"))
    heads = budget_heads(GatewayAppArgs.model_validate(app["args"]).catalog)
    smollm2 = heads["smollm2-135m-instruct"]
    assert not smollm2.evictable and smollm2.memory_gib > 0  # pinned
    assert heads["qwen2.5-coder-1.5b-instruct"].evictable
    assert "loopback/smollm2-135m-instruct" not in heads  # external: holds nothing here
    assert all(h.memory_gib > 0 for h in heads.values())
    catalog = GatewayAppArgs.model_validate(app["args"]).catalog
    assert not budget_heads(catalog, 11.8)["smollm2-135m-instruct"].evictable  # 2.5 + 6.2 fit
    small = budget_heads(catalog, 8.0)
    assert small["smollm2-135m-instruct"].evictable  # pin dropped: 2.5 + 6.2 > 8
    assert small["qwen2.5-coder-1.5b-instruct"].evictable


@pytest.fixture(autouse=True)
def _no_lease_left() -> None:
    Lease.holder = None


def test_the_room_wait_is_told_only_when_the_head_does_not_fit() -> None:
    """What ``Retry-After`` adds for making room: nothing when the head fits beside the
    heads holding memory, else the wait for Serve to take them down."""
    orders, clock = Orders(), Clock()
    k = keeper(Serve(set(), orders), orders, clock, budget=10)
    assert k.room_wait_s("tools", {"chat", "embed"}) == 0  # 2.5 + 1.5 + 6 = 10
    assert k.room_wait_s("tools", {"chat", "vision", "tools"}) == 10  # refused_after_s
    assert k.room_wait_s("unknown", {"chat", "vision"}) == 0
