"""One memory budget for the heads: waking one first puts least recently used idle ones to sleep.

Secondary heads sleep after an idle window (Serve scales them to zero), but a user who
touches several within that window wakes them all, and on a small machine Ray's memory
monitor then kills replicas. So, before a sleeping head is woken (``HeadWaker``), the
``BudgetKeeper`` adds up the awake heads' declared footprints (``memory_gib`` in the
catalog) and, when the head would push the sum past ``GATEWAY_MEMORY_BUDGET``, orders the
least recently used idle heads to sleep, waits until Serve has taken them down, and only
then lets the wake go. A head with a call in flight is never put to sleep: the order is
carried out by the head's own autoscaling policy inside Serve's controller
(``deployments/sleep_policy.py``), which scales it to zero only while Serve counts no
request running or queued for it; a head that stays up after an order is taken as busy
and the next one is chosen. Pinned heads, heads that never sleep (fixed replicas) and
dedicated endpoints (not in the catalog's budget at all) are never chosen. When nothing
can be freed the wake is not sent and the caller keeps answering 503 ``model_warming``.

Gateway replicas decide one at a time: the keeper holds a database lease (the dedicated
reconciler's pattern) from its first look at the heads until the wake goes out.

The keeper is a plain class: the clock, the view of the heads, the orders and the lease
are injected, so its choices are unit-tested without Ray (tests/unit/heads/test_budget.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BudgetHead:
    """What the budget knows of one catalog head."""

    model_id: str
    memory_gib: float
    evictable: bool
    """Sleeps and is not pinned (or its pin was dropped): the only kind ever put to sleep
    for another."""
    pinned: bool = False
    """The catalog pins it awake and it could sleep (a pin on a head with fixed replicas
    changes nothing). Honoured only while the budget holds it beside the largest
    sleeping head (``honour_pins``)."""


class Verdict(Enum):
    WAKE = "wake"
    """Room enough now: send the wake."""
    MAKE_ROOM = "make_room"
    """Room once ``Decision.evict`` are asleep."""
    NO_ROOM = "no_room"
    """Even with every idle evictable head asleep it would not fit: do not wake it now."""


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    evict: tuple[str, ...] = ()
    awake_gib: float = 0.0
    """What the other awake heads hold now."""
    needed_gib: float = 0.0
    """The head's own footprint."""


def plan_room(
    target: str,
    heads: Mapping[str, BudgetHead],
    awake: Iterable[str],
    busy: Iterable[str],
    last_use: Mapping[str, float],
    budget_gib: float,
) -> Decision:
    """Which awake heads must sleep before ``target`` wakes, least recently used first.

    ``awake``: heads holding a replica (running or starting); ``busy``: heads that must
    not be chosen now (a call in flight or queued, as far as the gateway can tell);
    ``last_use``: when each head was last called (a head never called counts as oldest).
    A head the catalog gives no footprint counts as 0 GiB (``gateway check`` says so).
    """
    needed = heads[target].memory_gib if target in heads else 0.0
    others = [m for m in set(awake) if m != target and m in heads]
    held = sum(heads[m].memory_gib for m in others)
    if held + needed <= budget_gib:
        return Decision(Verdict.WAKE, (), held, needed)
    excluded = set(busy)
    candidates = sorted(
        (m for m in others if heads[m].evictable and m not in excluded),
        key=lambda m: (last_use.get(m, float("-inf")), m),
    )
    chosen: list[str] = []
    left = held
    for model_id in candidates:
        if left + needed <= budget_gib:
            break
        chosen.append(model_id)
        left -= heads[model_id].memory_gib
    if left + needed > budget_gib:
        return Decision(Verdict.NO_ROOM, (), held, needed)
    return Decision(Verdict.MAKE_ROOM, tuple(chosen), held, needed)


class SleepOrders(Protocol):
    """Orders to a head's autoscaling policy to scale it to zero while idle."""

    def order(self, model_id: str, for_model: str) -> None: ...

    def clear(self, model_id: str) -> None: ...


class Lease(Protocol):
    """One holder at a time across gateway replicas (a database row with an expiry)."""

    def acquire(self) -> bool: ...

    def release(self) -> None: ...


@dataclass
class KeeperTiming:
    poll_s: float = 1.0
    """How often the heads are looked at again while waiting for room or for the lease."""
    deadline_s: float = 120.0
    """Give up making room after this (the wake is not sent; the next call tries again)."""
    refused_after_s: float = 45.0
    """A head still awake this long after its order is taken as busy: its policy refused.
    Serve averages a head's request count over ``look_back_period_s`` (30 s), so an idle
    head that had a call just before its order goes down ~30 s later (measured: 33.7 s,
    tests/cluster/test_sleep_orders.py)."""
    recent_use_s: float = 5.0
    """A head this replica called this recently is taken as busy."""


@dataclass
class _Memory:
    last_use: dict[str, float] = field(default_factory=dict)
    ordered_at: dict[str, float] = field(default_factory=dict)


class BudgetKeeper:
    """Makes room under the heads' memory budget before a wake; see the module docstring."""

    def __init__(
        self,
        heads: Mapping[str, BudgetHead],
        budget_gib: float,
        awake: Callable[[], Iterable[str]],
        orders: SleepOrders,
        lease: Lease | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        timing: KeeperTiming | None = None,
        on_evict: Callable[[str, str], None] | None = None,
    ) -> None:
        """``awake``: the heads holding a replica now (blocking: Serve's instance details,
        run in a thread); ``on_evict(model, for_model)``: counts an eviction (metrics)."""
        self.heads = dict(heads)
        self.budget_gib = budget_gib
        self._awake = awake
        self._orders = orders
        self._lease = lease
        self._clock = clock
        self._sleep = sleep
        self._timing = timing or KeeperTiming()
        self._on_evict = on_evict
        self._memory = _Memory()

    def room_wait_s(self, target: str, awake: Iterable[str]) -> float:
        """What making room will add to ``target``'s wake, as ``Retry-After`` tells a
        client: 0 when it fits beside ``awake`` (the heads holding replicas now), else the
        wait for Serve to take the chosen heads down (``refused_after_s``: 33.7 s measured
        for a head called just before its order)."""
        plan = plan_room(target, self.heads, awake, (), {}, self.budget_gib)
        return 0.0 if plan.verdict is Verdict.WAKE else self._timing.refused_after_s

    def note_use(self, model_id: str) -> None:
        """A call to ``model_id``'s head was just accepted (the LRU order's input)."""
        self._memory.last_use[model_id] = self._clock()

    async def make_room(self, target: str) -> bool:
        """True once ``target`` may wake; False when it may not now (the caller's 503 stands)."""
        if target not in self.heads:
            return True
        deadline = self._clock() + self._timing.deadline_s
        while self._clock() < deadline:
            if await self._holds_lease():
                try:
                    outcome = await self._decide_under_lease(target, deadline)
                finally:
                    await asyncio.to_thread(self._release)
                if outcome is not None:
                    return outcome
            await self._sleep(self._timing.poll_s)
        logger.warning("no room for head %s within %.0f s", target, self._timing.deadline_s)
        return False

    async def _holds_lease(self) -> bool:
        if self._lease is None:
            return True
        return await asyncio.to_thread(self._lease.acquire)

    def _release(self) -> None:
        if self._lease is not None:
            self._lease.release()

    async def _decide_under_lease(self, target: str, deadline: float) -> bool | None:
        """Orders sleeps until ``target`` fits; None when the deadline passed meanwhile."""
        while self._clock() < deadline:
            awake = set(await asyncio.to_thread(self._awake))
            self._forget_done_orders(awake)
            decision = plan_room(
                target,
                self.heads,
                awake,
                self._busy(awake),
                self._memory.last_use,
                self.budget_gib,
            )
            if decision.verdict is Verdict.WAKE:
                await asyncio.to_thread(self._orders.clear, target)
                self._memory.ordered_at.pop(target, None)
                return True
            if decision.verdict is Verdict.NO_ROOM:
                if self._only_busy_in_the_way(target, awake):
                    # A head just called (or with a call in flight) will be idle soon:
                    # wait for it here rather than leave the wake to the caller's retry,
                    # which Retry-After sends back only after the whole expected wake.
                    await self._sleep(self._timing.poll_s)
                    if self._lease is not None:
                        await asyncio.to_thread(self._lease.acquire)
                    continue
                logger.warning(
                    "head %s (%.1f GiB) does not fit: %.1f GiB awake, budget %.1f GiB, "
                    "nothing idle to put to sleep",
                    target,
                    decision.needed_gib,
                    decision.awake_gib,
                    self.budget_gib,
                )
                return False
            for model_id in decision.evict:
                await asyncio.to_thread(self._evict, model_id, target)
            await self._sleep(self._timing.poll_s)
            if self._lease is not None:  # renew while waiting for Serve to take them down
                await asyncio.to_thread(self._lease.acquire)
        return None

    def _only_busy_in_the_way(self, target: str, awake: set[str]) -> bool:
        """Whether ``target`` would fit if the heads now busy were idle."""
        plan = plan_room(target, self.heads, awake, (), self._memory.last_use, self.budget_gib)
        return plan.verdict is not Verdict.NO_ROOM

    def _busy(self, awake: set[str]) -> set[str]:
        """Heads not to choose: called very recently here, or still up long after an order."""
        now = self._clock()
        recent = {
            m for m, at in self._memory.last_use.items() if now - at < self._timing.recent_use_s
        }
        refused = {
            m
            for m, at in self._memory.ordered_at.items()
            if m in awake and now - at >= self._timing.refused_after_s
        }
        return recent | refused

    def _forget_done_orders(self, awake: set[str]) -> None:
        """Orders whose head is asleep are done (the order itself stays for the logs: the
        head's policy ignores an order older than the head's latest wake)."""
        for model_id in [m for m in self._memory.ordered_at if m not in awake]:
            del self._memory.ordered_at[model_id]

    def _evict(self, model_id: str, for_model: str) -> None:
        if model_id in self._memory.ordered_at:
            return  # already ordered: Serve is taking it down
        self._orders.order(model_id, for_model)
        self._memory.ordered_at[model_id] = self._clock()
        logger.info(
            "head %s put to sleep for %s (memory budget %.1f GiB)",
            model_id,
            for_model,
            self.budget_gib,
        )
        if self._on_evict is not None:
            self._on_evict(model_id, for_model)


@dataclass(frozen=True)
class PinVerdict:
    """Which pinned heads stay pinned under a budget, and why the others do not."""

    kept: tuple[str, ...]
    dropped: tuple[str, ...]
    largest: BudgetHead | None
    """The largest head that sleeps and is not pinned: what a pin must leave room for."""
    always_gib: float
    """What the heads that never sleep (fixed replicas) hold."""


def honour_pins(heads: Mapping[str, BudgetHead], budget_gib: float) -> PinVerdict:
    """Pins kept while the never-sleeping heads, the kept pins and the largest sleeping
    head fit the budget together, in catalog order; a pin that would not fit is dropped.

    A pin the budget cannot hold would starve the largest head: it could never wake (every
    call 503 ``model_warming``). Dropped, the pinned head is evicted like any other when a
    head needs its room, and woken again by its next call (a pinned head has no idle window:
    it sleeps only when ordered, ``deployments/sleep_policy.py``).
    """
    always = sum(h.memory_gib for h in heads.values() if not h.evictable and not h.pinned)
    largest = max(
        (h for h in heads.values() if h.evictable and not h.pinned),
        key=lambda h: h.memory_gib,
        default=None,
    )
    held = always + (largest.memory_gib if largest is not None else 0.0)
    kept: list[str] = []
    dropped: list[str] = []
    for head in heads.values():
        if not head.pinned:
            continue
        if held + head.memory_gib <= budget_gib:  # plan_room's own sum: same rounding
            kept.append(head.model_id)
            held += head.memory_gib
        else:
            dropped.append(head.model_id)
    return PinVerdict(tuple(kept), tuple(dropped), largest, always)


class _CatalogEntry(Protocol):
    id: str
    memory_gib: float | None
    pinned: bool

    @property
    def is_external(self) -> bool: ...

    @property
    def head_id(self) -> str: ...

    @property
    def deployment(self) -> object: ...

    @property
    def adapter_head_id(self) -> str | None: ...


def sleeps_when_idle(autoscaling: Mapping[str, object] | None) -> bool:
    """Whether a head's autoscaling lets Serve scale it to zero (its only way to sleep)."""
    return autoscaling is not None and autoscaling.get("min_replicas", 1) == 0


def budget_heads(
    models: Iterable[_CatalogEntry], budget_gib: float | None = None
) -> dict[str, BudgetHead]:
    """The catalog's own heads as the budget counts them (external models hold nothing here).

    A chat model's separate adapter head (``adapter_head_id``) counts as one more head of
    the model's ``memory_gib`` (declared LoRA slots included), always evictable: it sleeps
    when idle whatever the model's own head does, and pinning is for base traffic.
    With ``budget_gib``, a pin the budget cannot hold is dropped (``honour_pins``): that
    head becomes evictable like the others.
    """
    heads: dict[str, BudgetHead] = {}
    for model in models:
        if model.is_external or model.head_id != model.id:
            continue
        autoscaling = getattr(model.deployment, "autoscaling_config", None)
        sleeps = sleeps_when_idle(autoscaling)
        heads[model.id] = BudgetHead(
            model.id,
            model.memory_gib or 0.0,
            evictable=sleeps and not model.pinned,
            pinned=sleeps and model.pinned,
        )
        adapters = model.adapter_head_id
        if adapters is not None:
            heads[adapters] = BudgetHead(adapters, model.memory_gib or 0.0, evictable=True)
    if budget_gib is None:
        return heads
    verdict = honour_pins(heads, budget_gib)
    for model_id in verdict.dropped:
        heads[model_id] = replace(heads[model_id], evictable=True)
    return heads
