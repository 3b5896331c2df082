"""Wire details of docs/reference/dedicated.md a strict reader checks (an audit).

Request types are the API's (an integer is not ``"1"`` nor ``true``), the
preview quotes the PUT's own body, ``live`` is null as soon as nothing is meant
to be deployed, a hybrid target's floor below 1 is ``reserved_floor_required``
whatever its sign, and a call that wakes an endpoint at rest may wait for the
boot longer than an ordinary first event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.unit.dedicated.conftest import DedicatedHarness, build, create_body

CHAT = {"model": "ded/my-bot", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _error(resp: httpx.Response, status: int, code: str | None) -> None:
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code, resp.text


async def _active(ded: DedicatedHarness, c: httpx.AsyncClient, **overrides: Any) -> str:
    created = await c.post("/api/dedicated", json=create_body(**overrides))
    assert created.status_code == 201, created.text
    eid: str = created.json()["endpoint_id"]
    ded.converge()
    ded.converge(boot=True)
    return eid


async def test_request_numbers_and_booleans_are_not_coerced(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        for overrides in (
            {"min_replicas": "1"},
            {"min_replicas": True},
            {"max_replicas": 2.5},
            {"engine": {"prefix_caching": 1}},
            {"engine": {"prefix_caching": "true"}},
            {"engine": {"max_num_seqs": "4"}},
            {"scaling": {"target_inputs": "4"}},
            {"mode": ["spot"]},
        ):
            resp = await c.post("/api/dedicated", json=create_body(**overrides))
            _error(resp, 400, "invalid_value")
        eid = await _active(ded, c)
        path = f"/api/dedicated/{eid}"
        _error(await c.patch(path, json={"max_replicas": "3"}), 400, "invalid_value")
        _error(
            await c.patch(path, json={"scaling": {"buffer_replicas": 1.5}}), 400, "invalid_value"
        )
        assert (await c.get(path)).json()["max_replicas"] == 2
        # JSON Schema reads 3.0 as the integer 3, and so does the server (issue 16).
        patched = await c.patch(path, json={"max_replicas": 3.0})
        assert patched.status_code == 200, patched.text
        assert (await c.get(path)).json()["max_replicas"] == 3


async def test_preview_takes_the_put_body_as_is(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        eid = await _active(ded, c)
        preview = f"/api/dedicated/{eid}/mode/preview"
        plain = await c.post(preview, json={"mode": "reserved"})
        quoted = await c.post(preview, json={"mode": "reserved", "confirm_redeploy": True})
        assert plain.status_code == quoted.status_code == 200, quoted.text
        assert quoted.json() == plain.json()
        _error(
            await c.post(preview, json={"mode": "reserved", "nope": 1}), 400, "unknown_parameter"
        )
        assert (await c.get(f"/api/dedicated/{eid}")).json()["mode"] == "spot"


async def test_live_is_null_once_nothing_is_meant_to_run(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        eid = await _active(ded, c)
        path = f"/api/dedicated/{eid}"
        assert (await c.get(path)).json()["live"] == {"replicas_ready": 1, "replicas_total": 1}
        paused = (await c.post(f"{path}/pause")).json()
        assert paused["status"] == "paused" and paused["live"] is None
        # Resumed before the reconciler even removed the app: warming, not active.
        resumed = (await c.post(f"{path}/resume")).json()
        assert resumed["status"] == "warming" and resumed["live"] is None
        ded.converge()
        ded.converge(boot=True)
        assert (await c.get(path)).json()["status"] == "active"
        deleted = (await c.delete(path)).json()
        assert deleted["status"] == "deleted" and deleted["live"] is None


async def test_hybrid_floor_below_one_is_reserved_floor_required(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        hybrid = create_body(mode="hybrid", reserved_floor=-1)
        _error(await c.post("/api/dedicated", json=hybrid), 400, "reserved_floor_required")
        spot = create_body(reserved_floor=-1)
        _error(await c.post("/api/dedicated", json=spot), 400, "invalid_value")
        eid = await _active(ded, c)
        target = {"mode": "hybrid", "reserved_floor": -1}
        quote = (await c.post(f"/api/dedicated/{eid}/mode/preview", json=target)).json()
        assert quote["allowed"] is False and quote["blocked_reason"] == "reserved_floor_required"
        change = {**target, "confirm_redeploy": True}
        resp = await c.put(f"/api/dedicated/{eid}/mode", json=change)
        _error(resp, 400, "reserved_floor_required")
        negative = {"mode": "reserved", "reserved_floor": -1, "confirm_redeploy": True}
        _error(await c.put(f"/api/dedicated/{eid}/mode", json=negative), 400, "invalid_value")


async def test_patch_null_floor_outside_hybrid_leaves_it_unchanged(ded: DedicatedHarness) -> None:
    async with ded.client() as c:
        eid = await _active(ded, c)
        path = f"/api/dedicated/{eid}"
        resp = await c.patch(path, json={"reserved_floor": None, "max_replicas": 3})
        assert resp.status_code == 200, resp.text
        assert resp.json()["reserved_floor"] == 0 and resp.json()["max_replicas"] == 3
        _error(await c.patch(path, json={"reserved_floor": 0}), 400, "invalid_value")


async def test_a_waking_call_waits_for_the_boot(tmp_path: Path) -> None:
    """Ordinary calls get ``first_event_s``; one that boots a replica gets ``wake_timeout_s``."""
    ded = build(tmp_path, timeouts={"first_event_s": 0.05, "idle_s": 5})
    ded.backend.boot_delay_s = 0.3
    try:
        async with ded.client() as c:
            await _active(ded, c, min_replicas=0)
            answer = await c.post("/v1/chat/completions", json=CHAT)
            assert answer.status_code == 200, answer.text
    finally:
        await ded.dedicated.router.stop()
        await ded.app.state.gateway.text.metering.aclose()
    slow = build(tmp_path / "short", {"wake_timeout_s": 0.1}, timeouts={"first_event_s": 0.05})
    slow.backend.boot_delay_s = 0.3
    try:
        async with slow.client() as c:
            await _active(slow, c, min_replicas=0)
            _error(await c.post("/v1/chat/completions", json=CHAT), 504, "upstream_timeout")
    finally:
        await slow.dedicated.router.stop()
        await slow.app.state.gateway.text.metering.aclose()
