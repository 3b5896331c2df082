"""Every refusal of docs/reference/dedicated.md#errors, through the real app (fake Serve
backend)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.unit.dedicated.conftest import DedicatedHarness, create_body


async def _create(c: httpx.AsyncClient, **overrides: Any) -> dict[str, Any]:
    resp = await c.post("/api/dedicated", json=create_body(**overrides))
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def _error(resp: httpx.Response, status: int, code: str | None) -> None:
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code


async def test_auth_scope_and_ownership(ded: DedicatedHarness) -> None:
    async with ded.client() as c, ded.client("other") as other, ded.client("no_scope") as narrow:
        created = await _create(c)
        path = f"/api/dedicated/{created['endpoint_id']}"
        _error(await other.get(path), 404, "endpoint_not_found")
        _error(await other.delete(path), 404, "endpoint_not_found")
        assert (await other.get("/api/dedicated")).json() == []
        _error(await narrow.get("/api/dedicated"), 403, "insufficient_scope")
        anonymous = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=ded.app), base_url="http://gateway.test"
        )
        async with anonymous:
            _error(await anonymous.get("/api/dedicated/rates"), 401, "invalid_api_key")
        _error(await c.get("/api/dedicated/ded_nope"), 404, "endpoint_not_found")


async def test_create_refusals(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        cases: list[tuple[dict[str, Any], int, str]] = [
            ({"model_id": "ded-banned"}, 400, "model_not_eligible"),  # config's list
            ({"model_id": "ded-tts"}, 400, "model_not_eligible"),  # not a chat model
            ({"model_id": "no-such-model"}, 400, "model_not_eligible"),
            ({"alias_slug": "No_Caps"}, 400, "invalid_value"),
            ({"alias_slug": "ab"}, 400, "invalid_value"),
            ({"max_replicas": 17}, 400, "replica_cap_exceeded"),
            ({"min_replicas": 3, "max_replicas": 2}, 400, "invalid_value"),
            ({"mode": "hybrid"}, 400, "reserved_floor_required"),
            ({"mode": "hybrid", "reserved_floor": 0}, 400, "reserved_floor_required"),
            ({"mode": "hybrid", "reserved_floor": 3}, 400, "replica_cap_exceeded"),
            ({"reserved_floor": 1}, 400, "invalid_value"),
            ({"model_id": "ded-a10g", "mode": "spot"}, 400, "mode_not_priced"),
            (
                {"model_id": "ded-a10g", "mode": "hybrid", "reserved_floor": 1},
                400,
                "mode_not_priced",
            ),
            ({"engine": {"speculative_tokens": 2}}, 400, "engine_setting_unavailable"),
            ({"engine": {"max_model_len": 512}}, 400, "invalid_value"),
            ({"engine": {"unknown": 1}}, 400, "unknown_parameter"),
            ({"scaling": {"target_inputs": 9}}, 400, "target_inputs_exceeds_admission"),
            ({"scaling": {"engine_target_waiting": 3}}, 400, "queue_signal_unavailable"),
            ({"scaling": {"scaledown_window_seconds": 60}}, 400, "scaling_policy_unsupported"),
            ({"scaling": {"nope": 1}}, 400, "unknown_parameter"),
        ]
        for overrides, status, code in cases:
            _error(await c.post("/api/dedicated", json=create_body(**overrides)), status, code)
        # A reserved-only card takes reserved; an internal org's cap is 32.
        await _create(c, model_id="ded-a10g", mode="reserved", alias_slug="reserved-one")
    async with ded.client("internal") as internal:
        await _create(internal, max_replicas=32, alias_slug="big-one")


async def test_alias_unique_never_reused_and_org_quota(ded: DedicatedHarness) -> None:
    async with ded.client() as c, ded.client("other") as other:
        first = await _create(c, alias_slug="taken")
        _error(
            await other.post("/api/dedicated", json=create_body(alias_slug="taken")),
            409,
            "alias_taken",
        )
        await _create(c, alias_slug="second")
        _error(
            await c.post("/api/dedicated", json=create_body(alias_slug="third")),
            403,
            "dedicated_quota_exceeded",
        )
        deleted = await c.delete(f"/api/dedicated/{first['endpoint_id']}")
        assert deleted.json()["status"] == "deleted"
        await _create(c, alias_slug="third")  # a deleted endpoint frees its quota slot...
        _error(
            await other.post("/api/dedicated", json=create_body(alias_slug="taken")),
            409,
            "alias_taken",
        )


async def test_patch_refusals_change_nothing(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        created = await _create(c)
        path = f"/api/dedicated/{created['endpoint_id']}"
        for body, code in [
            ({"mode": "reserved"}, "mode_change_requires_redeploy"),
            ({"scaling": {}}, "invalid_value"),
            ({"reserved_floor": 1}, "invalid_value"),
            ({"max_replicas": 20}, "replica_cap_exceeded"),
            ({"scaling": {"target_inputs": 50}}, "target_inputs_exceeds_admission"),
            ({"scaling": {"engine_target_waiting": 2}}, "queue_signal_unavailable"),
            ({"scaling": {"scaledown_window_seconds": 40}}, "scaling_policy_unsupported"),
        ]:
            _error(await c.patch(path, json=body), 400, code)
        assert (await c.get(path)).json() == created | {"status": "provisioning"}


async def test_mode_change_refusals_in_order(ded: DedicatedHarness) -> None:
    async with ded.client() as c, ded.client("member") as member:
        created = await _create(c)
        path = f"/api/dedicated/{created['endpoint_id']}/mode"
        change = {"mode": "reserved", "confirm_redeploy": True}
        _error(await member.put(path, json=change), 403, "insufficient_permissions")
        for confirm in (False, "true", 1, None):
            _error(
                await c.put(path, json={**change, "confirm_redeploy": confirm}),
                400,
                "confirmation_required",
            )
        _error(await c.put(path, json={"mode": "reserved"}), 400, "confirmation_required")
        _error(await c.put(path, json={**change, "mode": "spot"}), 400, "mode_unchanged")
        _error(await c.put(path, json={**change, "mode": "hybrid"}), 400, "reserved_floor_required")
        hybrid = {**change, "mode": "hybrid", "reserved_floor": 5}
        _error(await c.put(path, json=hybrid), 400, "replica_cap_exceeded")
        _error(await c.put(path, json=change), 409, "endpoint_busy")  # still provisioning
        ded.converge()
        ded.converge(boot=True)
        accepted = await c.put(path, json=change)
        assert accepted.status_code == 200 and accepted.json()["status"] == "updating"
        _error(await c.put(path, json={**change, "mode": "spot"}), 409, "endpoint_busy")
        ded.converge()
        ded.converge(boot=True)
        too_soon = await c.put(path, json={**change, "mode": "spot"})
        _error(too_soon, 429, "mode_change_too_soon")
        assert 0 < int(too_soon.headers["Retry-After"]) <= 600
        preview = await c.post(f"{path}/preview", json={"mode": "spot"})
        assert preview.json()["blocked_reason"] == "mode_change_too_soon"
        assert 0 < preview.json()["cooldown_seconds_remaining"] <= 600


async def test_paused_failed_and_spending_cap(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        created = await _create(c)
        eid = created["endpoint_id"]
        ded.converge()
        ded.converge(boot=True)
        change = {"mode": "reserved", "confirm_redeploy": True}
        await c.post(f"/api/dedicated/{eid}/pause")
        _error(await c.put(f"/api/dedicated/{eid}/mode", json=change), 409, "endpoint_paused")
        engine = {"engine": {"max_num_seqs": 2}, "confirm_redeploy": True}
        _error(await c.put(f"/api/dedicated/{eid}/engine", json=engine), 409, "endpoint_paused")
        unconfirmed = {**engine, "confirm_redeploy": "yes"}
        resp = await c.put(f"/api/dedicated/{eid}/engine", json=unconfirmed)
        _error(resp, 400, "confirmation_required")
        # 50 EUR cap at 0.6 EUR/h spot: 84 replica-hours this month reach it.
        await c.post(f"/api/dedicated/{eid}/resume")
        ded.converge()
        ded.converge(boot=True)
        ded.converge(seconds=84 * 3600)
        _error(await c.put(f"/api/dedicated/{eid}/mode", json=change), 402, "spending_cap_reached")
        await c.post(f"/api/dedicated/{eid}/pause")
        _error(await c.post(f"/api/dedicated/{eid}/resume"), 402, "spending_cap_reached")
        _error(await c.put(f"/api/dedicated/{eid}/mode", json=change), 409, "endpoint_paused")


async def test_failed_endpoint_is_not_ready(ded: DedicatedHarness) -> None:
    ded.backend.fail_on.append({"max_model_len": 4096})
    async with ded.client() as c:
        eid = (await _create(c))["endpoint_id"]
        ded.converge()
        ded.converge(boot=True)
        assert (await c.get(f"/api/dedicated/{eid}")).json()["status"] == "error"
        change = {"mode": "reserved", "confirm_redeploy": True}
        _error(await c.put(f"/api/dedicated/{eid}/mode", json=change), 409, "endpoint_not_ready")
        chat = {"model": "ded/my-bot", "messages": [{"role": "user", "content": "x"}]}
        _error(await c.post("/v1/chat/completions", json=chat), 503, "model_unavailable")
