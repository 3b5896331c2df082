"""Exact money on dedicated endpoints (issue 16): rate history, policy rollback, shared floor."""

from __future__ import annotations

import pytest

from serve_app.dedicated.options import RateCardOptions
from serve_app.dedicated.routing.floor import FloorCounts, LocalFloorCounts, RedisFloorCounts
from serve_app.dedicated.routing.router import DedicatedRouter
from tests.unit.dedicated.conftest import DedicatedHarness
from tests.unit.dedicated.test_lifecycle import _active, _status


async def test_minutes_are_priced_at_the_rate_in_force_when_they_accrued(
    ded: DedicatedHarness,
) -> None:
    """l4 spot costs 0.6/h, then the card changes to 1.8/h: only later minutes cost more."""
    async with ded.client() as c:
        eid = await _active(ded, c)  # one spot replica, billed from its placement
        start_cost = (await _status(c, eid))["month_cost"]
        ded.clock.advance(600)
        before_change = (await _status(c, eid))["month_cost"]
        assert before_change - start_cost == pytest.approx(10 * 0.6 / 60)

        service = ded.dedicated.service
        dearer = RateCardOptions.model_validate(
            {**service.options.rate_card.model_dump(), "hourly_by_gpu_type": {"l4": {"spot": 1.8}}}
        )
        service.options = service.options.model_copy(update={"rate_card": dearer})
        # The new card takes effect when the gateway first runs with it (this read).
        assert (await _status(c, eid))["month_cost"] == pytest.approx(before_change)
        ded.clock.advance(600)
        after = (await _status(c, eid))["month_cost"]
        # Ten more minutes at the new rate; the first ten keep the old one.
        assert after - before_change == pytest.approx(10 * 1.8 / 60)
        rates = service.store.rate_card_history(dearer, ded.clock())
        assert [card.hourly_by_gpu_type["l4"].spot for _, card in rates] == [0.6, 1.8]


async def test_a_failed_engine_change_rolls_back_the_scaling_policy_too(
    ded: DedicatedHarness,
) -> None:
    async with ded.client() as c:
        eid = await _active(ded, c)
        # Store the default preset explicitly: an engine change re-derives a preset from
        # the new engine's admission bound.
        preset = {k: v for k, v in (await _status(c, eid))["scaling"].items() if k != "profile"}
        patched = await c.patch(f"/api/dedicated/{eid}", json={"scaling": preset})
        assert patched.status_code == 200, patched.text
        before = (await _status(c, eid))["scaling"]

        ded.backend.fail_on.append({"max_num_seqs": 3})
        change = {"engine": {"max_num_seqs": 3}, "confirm_redeploy": True}
        updating = (await c.put(f"/api/dedicated/{eid}/engine", json=change)).json()
        assert updating["scaling"] != before  # the preset followed the smaller bound
        ded.converge()
        ded.converge()
        ded.converge(boot=True)  # fails: rolling back
        ded.converge()
        ded.converge(boot=True)
        state = await _status(c, eid)
        assert state["status"] == "active" and state["engine"] is None
        assert state["scaling"] == before


@pytest.mark.parametrize("shared", ["redis", "memory"])
async def test_the_hybrid_floor_is_counted_over_every_gateway_replica(
    ded: DedicatedHarness, shared: str, request: pytest.FixtureRequest
) -> None:
    """Floor 1 x target_inputs 1: one call in flight anywhere fills the floor."""
    async with ded.client() as c:
        body = {"mode": "hybrid", "reserved_floor": 1, "max_replicas": 3}
        eid = await _active(ded, c, **body, scaling={"target_inputs": 1})
    row = ded.dedicated.store.get(eid)
    assert row is not None
    if shared == "redis":  # two gateway replicas, each with its own Redis connection
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        counts: list[FloorCounts] = [RedisFloorCounts.from_url(url, prefix=prefix) for _ in "ab"]
    else:  # the single-process default: one process, one count
        counts = [LocalFloorCounts()] * 2
    d = ded.dedicated
    replica_a, replica_b = (DedicatedRouter(d.router.ctx, floor) for floor in counts)
    try:
        assert await replica_a.choose_deployment(row, "call-1") == "head"
        # Replica B has no call of its own in flight, but the floor is full.
        assert await replica_b.choose_deployment(row, "call-2") == "burst"
        await replica_a.floor.release("ded-my-bot", "head", "call-1")
        assert await replica_b.choose_deployment(row, "call-3") == "head"
    finally:
        for floor in {id(f): f for f in counts}.values():
            await floor.aclose()
