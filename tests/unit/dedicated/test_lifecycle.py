"""The lifecycle (docs/reference/dedicated.md#lifecycle) through the real app and reconciler,
on the fake Serve backend."""

from __future__ import annotations

from typing import Any

import httpx

from serve_app.dedicated.alias import is_dedicated_alias
from serve_app.dedicated.control.backend import AppObservation
from serve_app.dedicated.control.reconciler import Reconciler
from tests.unit.dedicated.conftest import DedicatedHarness, create_body

CHAT = {"model": "ded/my-bot", "messages": [{"role": "user", "content": "hello there"}]}


async def _status(c: httpx.AsyncClient, eid: str) -> dict[str, Any]:
    body: dict[str, Any] = (await c.get(f"/api/dedicated/{eid}")).json()
    return body


async def _active(ded: DedicatedHarness, c: httpx.AsyncClient, **overrides: Any) -> str:
    created = await c.post("/api/dedicated", json=create_body(**overrides))
    assert created.status_code == 201, created.text
    eid: str = created.json()["endpoint_id"]
    ded.converge()
    ded.converge(boot=True)
    assert (await _status(c, eid))["status"] == "active"
    return eid


async def test_create_warm_serve_patch_mode_pause_resume_delete(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        eid = await _provision_and_serve(ded, c)
        [replica] = ded.backend.replica_ids("ded-my-bot")
        await _patch_is_live(ded, c, eid, replica)
        await _mode_change_redeploys_in_place(ded, c, eid, replica)
        await _pause_and_resume(ded, c, eid)
        deleted = (await c.delete(f"/api/dedicated/{eid}")).json()
        assert deleted["status"] == "deleted" and deleted["month_minutes"]["spot"] > 0
        gone = await c.post("/v1/chat/completions", json=CHAT)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
        assert (await c.get(f"/api/dedicated/{eid}")).status_code == 404
        ded.converge()
        assert "ded-my-bot" not in ded.backend.apps
        assert (await c.get("/api/dedicated")).json() == []


async def _provision_and_serve(ded: DedicatedHarness, c: httpx.AsyncClient) -> str:
    created = (await c.post("/api/dedicated", json=create_body())).json()
    eid: str = created["endpoint_id"]
    assert created["status"] == "provisioning" and created["live"] is None
    assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 503
    ded.converge()  # the app is deployed; its replica boots
    assert (await _status(c, eid))["status"] == "provisioning"  # Serve had not reported it yet
    ded.converge()
    state = await _status(c, eid)
    assert state["status"] == "warming"
    assert state["live"] == {"replicas_ready": 0, "replicas_total": 1}
    warming = await c.post("/v1/chat/completions", json=CHAT)
    assert warming.status_code == 503 and warming.json()["error"]["code"] == "model_warming"
    assert int(warming.headers["Retry-After"]) >= 1
    ded.converge(boot=True)
    assert (await _status(c, eid))["status"] == "active"
    answer = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
    assert answer.status_code == 200 and answer.json()["model"] == "ded/my-bot"
    return eid


async def _patch_is_live(
    ded: DedicatedHarness, c: httpx.AsyncClient, eid: str, replica: str
) -> None:
    policy = {"target_inputs": 2, "buffer_replicas": 1}
    patched = await c.patch(f"/api/dedicated/{eid}", json={"max_replicas": 4, "scaling": policy})
    assert patched.json()["scaling"] == {**policy, "profile": "custom"}
    ded.converge()
    assert ded.backend.replica_ids("ded-my-bot") == [replica]  # live: no restart
    auto = ded.backend.apps["ded-my-bot"].spec.deployments[0].options["autoscaling_config"]
    assert auto["max_replicas"] == 4 and auto["policy"]["policy_kwargs"]["buffer_replicas"] == 1


async def _mode_change_redeploys_in_place(
    ded: DedicatedHarness, c: httpx.AsyncClient, eid: str, replica: str
) -> None:
    change = {"mode": "reserved", "confirm_redeploy": True}
    moved = (await c.put(f"/api/dedicated/{eid}/mode", json=change)).json()
    assert moved["status"] == "updating" and moved["mode"] == "reserved"
    assert moved["previous_mode"] == "spot" and moved["mode_changed_at"] is not None
    ded.converge()
    head = ded.backend.apps["ded-my-bot"].spec.deployments[0]
    assert head.options["ray_actor_options"]["resources"] == {"capacity_reserved": 0.001}
    assert ded.backend.replica_ids("ded-my-bot") != [replica]  # replaced in place
    ded.converge(boot=True)
    after = await _status(c, eid)
    assert after["status"] == "active" and after["endpoint_id"] == eid
    assert after["alias"] == "ded/my-bot"


async def _pause_and_resume(ded: DedicatedHarness, c: httpx.AsyncClient, eid: str) -> None:
    assert (await c.post(f"/api/dedicated/{eid}/pause")).json()["status"] == "paused"
    ded.converge()
    assert "ded-my-bot" not in ded.backend.apps and (await _status(c, eid))["live"] is None
    assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 503
    assert (await c.patch(f"/api/dedicated/{eid}", json={"min_replicas": 2})).status_code == 200
    ded.converge()
    assert "ded-my-bot" not in ded.backend.apps  # PATCH does not rescale a paused endpoint
    assert (await c.post(f"/api/dedicated/{eid}/resume")).json()["status"] == "warming"
    ded.converge()
    assert len(ded.backend.replica_ids("ded-my-bot")) == 2  # bounds re-applied on resume
    ded.converge(boot=True)
    assert (await _status(c, eid))["status"] == "active"


async def test_failed_engine_change_rolls_back_once(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        eid = await _active(ded, c)
        ded.backend.fail_on.append({"max_num_seqs": 3})
        change = {"engine": {"max_num_seqs": 3}, "confirm_redeploy": True}
        updating = (await c.put(f"/api/dedicated/{eid}/engine", json=change)).json()
        assert updating["status"] == "updating" and updating["engine"] == {"max_num_seqs": 3}
        ded.converge()  # deployed: the new replica starts...
        ded.converge()  # ...is seen placed (billed from here)...
        ded.converge(boot=True)  # ...and fails to boot
        state = await _status(c, eid)
        assert state["status"] == "updating" and state["engine"] is None  # rolling back
        ded.converge()
        ded.converge(boot=True)
        state = await _status(c, eid)
        assert state["status"] == "active" and state["engine"] is None
        assert state["engine_changed_at"] is not None  # the cooldown still counts
        history = (await c.get(f"/api/dedicated/{eid}/scaling-history")).json()["items"]
        assert [e["version"] for e in history][:1] == [3] and history[0]["capacity_class"] == "spot"
        assert any(e["error_code"] == "boot_failed" for e in history)


async def test_failed_rollback_ends_in_error(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        eid = await _active(ded, c)
        ded.backend.fail_on.append({"max_model_len": 4096})  # every configuration fails now
        ded.clock.advance(700)
        change = {"mode": "reserved", "confirm_redeploy": True}
        assert (await c.put(f"/api/dedicated/{eid}/mode", json=change)).status_code == 200
        for _ in range(2):
            ded.converge()
            ded.converge(boot=True)
        state = await _status(c, eid)
        assert state["status"] == "error" and state["mode"] == "spot"


async def test_scale_to_zero_wakes_on_first_call(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        eid = await _active(ded, c, min_replicas=0)
        assert (await _status(c, eid))["live"] == {"replicas_ready": 0, "replicas_total": 0}
        health = (await c.get(f"/api/dedicated/{eid}/health")).json()
        assert health["sampled"] is False and health["reason"] == "no_ready_replica"
        assert ded.backend.replica_ids("ded-my-bot") == []  # sampling never wakes it
        answer = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
        assert answer.status_code == 200
        assert len(ded.backend.replica_ids("ded-my-bot")) == 1  # the call booted one
        ded.converge()
        telemetry = (await c.get(f"/api/dedicated/{eid}/telemetry?window=24h")).json()
        assert telemetry["requests"] == {"ok": 1, "incomplete": 0, "error": 0}
        assert telemetry["cold_wait_ms"]["requests_with_wake"] == 1
        assert telemetry["capacity_verdict"] == "constrained"
        health = (await c.get(f"/api/dedicated/{eid}/health")).json()
        assert health["sampled"] is True and health["replicas_sampled"] == 1


async def test_billing_minutes_follow_replica_lifetimes(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        eid = await _active(ded, c)  # placed at t0+2 s (first observation with a node)
        ded.converge(seconds=600)
        state = await _status(c, eid)
        assert abs(state["month_minutes"]["spot"] - 10.0) < 0.05
        assert state["month_cost"] == state["month_cost_usd"]
        assert abs(state["month_cost"] - state["month_minutes"]["spot"] * 0.6 / 60) < 1e-9
        await c.post(f"/api/dedicated/{eid}/pause")
        ded.converge(seconds=60)  # the app is deleted; its replica is still stopping
        ded.converge(seconds=2)  # ...and gone at this observation: released
        ded.converge(seconds=3600)  # paused: nothing accrues
        state = await _status(c, eid)
        assert abs(state["month_minutes"]["spot"] - (10 + 62 / 60)) < 0.01
        [event] = (await c.get(f"/api/dedicated/{eid}/scaling-history")).json()["items"]
        assert event["scaled_down_at"] is not None and event["capacity_class"] is None
        assert event["calls_total"] == 0 and event["state"] == "released"


async def test_preview_quotes_the_cost_formula(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        eid = await _active(ded, c, model_id="ded-mtp", max_replicas=3)
        quote = (
            await c.post(
                f"/api/dedicated/{eid}/mode/preview", json={"mode": "hybrid", "reserved_floor": 2}
            )
        ).json()
        assert quote["from"] == {"mode": "spot", "reserved_floor": 0}
        assert quote["to"] == {"mode": "hybrid", "reserved_floor": 2}
        assert quote["kind"] == "redeploy" and quote["allowed"] is True
        reload = quote["reload"]
        assert reload["estimate_source"] == "observed"  # the boot timed above
        assert (
            reload["replicas_reloaded"],
            reload["replicas_reserved"],
            reload["replicas_spot"],
        ) == (2, 2, 0)
        expected = 2 * (reload["estimated_boot_seconds"] / 60) * (2 * 1.2 / 60)
        assert abs(reload["estimated_cost"] - expected) < 1e-12
        assert reload["estimated_cost_usd"] == reload["estimated_cost"]
        assert quote["rate_per_card_minute_before"] == 0.6 / 60
        assert reload["currency"] == "eur"
        member = ded.client("member")
        async with member:
            blocked = (
                await member.post(f"/api/dedicated/{eid}/mode/preview", json={"mode": "reserved"})
            ).json()
        assert (
            blocked["allowed"] is False and blocked["blocked_reason"] == "insufficient_permissions"
        )
        assert (await c.get(f"/api/dedicated/{eid}")).json()["mode"] == "spot"  # nothing stored


async def test_hybrid_runs_floor_on_reserved_and_bursts_on_spot(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        eid = await _active(ded, c, mode="hybrid", reserved_floor=1, max_replicas=3)
        spec = ded.backend.apps["ded-my-bot"].spec
        classes = {d.name: d.capacity_class for d in spec.deployments}
        assert classes == {"head": "reserved", "burst": "spot"}
        state = await _status(c, eid)
        assert state["capacity_converging"] is True and state["reserved_floor"] == 1
        assert (
            await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})
        ).status_code == 200


async def test_new_reconciler_adopts_running_apps_and_leaves_others(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        await _active(ded, c)
        assert await ded.dedicated.reconciler.tick() is True  # the running gateway's
        replicas = ded.backend.replica_ids("ded-my-bot")
        deploys = len(ded.backend.deployed)
        ded.backend.apps["ded-orphan"] = ded.backend.apps["ded-my-bot"]
        restarted = Reconciler(ded.dedicated.reconciler.ctx)
        assert await restarted.tick() is False  # the first reconciler still holds the lease
        await ded.dedicated.reconciler.stop()  # gateway replica stops: lease released
        assert await restarted.tick() is True
        assert len(ded.backend.deployed) == deploys  # nothing redeployed
        assert ded.backend.replica_ids("ded-my-bot") == replicas
        assert ded.backend.deleted == ["ded-orphan"]  # only an unwanted ded-* app
        assert "gateway" in ded.backend.status()
        ded.backend.apps.pop("ded-my-bot")  # e.g. `serve deploy` of the ops config
        await restarted.tick()
        assert "ded-my-bot" in ded.backend.apps  # recreated


def test_observation_helpers_and_alias_predicate() -> None:
    assert is_dedicated_alias("ded/x") and not is_dedicated_alias("smollm2")
    obs = AppObservation("ded-x", "DEPLOY_FAILED")
    assert obs.failed and not obs.running and obs.total == 0
