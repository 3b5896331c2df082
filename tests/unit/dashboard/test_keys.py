"""``/api/keys`` with a dashboard session (docs/reference/dashboard.md#keys)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.dashboard import signed_in
from tests.fixtures.gateway import GatewayHarness, build_harness, start_heads


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _create(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    resp = await http.post("/api/keys", json={"name": "laptop", **body})
    assert resp.status_code == 201, resp.text
    created: dict[str, Any] = resp.json()
    return created


async def test_create_shows_the_key_once_and_it_works(gateway: GatewayHarness) -> None:
    expires = int(time.time()) + 3600
    async with signed_in(gateway, "alice") as http:
        created = await _create(http, scopes=["inference"], expires_at=expires)
        listing = (await http.get("/api/keys")).json()
    raw = created["key"]
    assert raw.startswith("gwk_") and created["prefix"] == raw[4:12]
    assert created["name"] == "laptop" and created["scopes"] == ["inference"]
    assert created["user_name"] == "alice" and created["expires_at"] == expires
    assert created["revoked_at"] is None and created["last_used_at"] is None
    item = next(k for k in listing["data"] if k["id"] == created["id"])
    assert "key" not in item and raw not in str(listing)
    async with gateway.client(raw) as api:
        assert (await api.get("/v1/models")).status_code == 200
    async with signed_in(gateway, "alice") as http:
        used = next(k for k in (await http.get("/api/keys")).json()["data"] if k["name"])
    assert used["last_used_at"] is not None


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"scopes": ["inference", "admin"]}, "invalid_scopes"),
        ({"scopes": []}, "invalid_scopes"),
        ({"expires_at": 1}, "invalid_value"),
        ({"scopes": "inference"}, "invalid_value"),
    ],
)
async def test_bad_key_requests_are_400(
    gateway: GatewayHarness, body: dict[str, Any], code: str
) -> None:
    async with signed_in(gateway, "alice") as http:
        resp = await http.post("/api/keys", json={"name": "k", **body})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == code


async def test_scopes_are_enforced(gateway: GatewayHarness) -> None:
    async with signed_in(gateway, "alice") as http:
        dedicated_only = (await _create(http, scopes=["dedicated"]))["key"]
    async with gateway.client(dedicated_only) as api:
        models = await api.get("/v1/models")
        keys = await api.get("/api/keys")
    assert models.status_code == 403
    assert models.json()["error"]["code"] == "insufficient_scope"
    assert keys.status_code == 403 and keys.json()["error"]["code"] == "session_required"


async def test_keys_routes_refuse_api_keys_and_anonymous_callers(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as api:
        with_key = [await api.get("/api/keys"), await api.post("/api/keys", json={"name": "x"})]
    async with gateway.client() as anonymous:
        without = await anonymous.get("/api/keys")
    for resp in with_key:
        assert resp.status_code == 403
        assert resp.json()["error"]["code"] == "session_required"
    assert without.status_code == 401


async def test_revoking_is_effective_at_once_on_every_replica(tmp_path: Path) -> None:
    """Two gateway replicas on one database, each caching verified keys for a minute."""
    first = build_harness(tmp_path / "gw.db", auth_cache_seconds=60)
    second = build_harness(tmp_path / "gw.db", auth_cache_seconds=60)
    for harness in (first, second):
        await start_heads(harness)
    first.store.create_key("alice", "acme")
    try:
        async with signed_in(first, "alice") as http:
            created = await _create(http)
            async with second.client(created["key"]) as api:
                assert (await api.get("/v1/models")).status_code == 200  # cached on `second`
                revoked = await http.delete(f"/api/keys/{created['id']}")
                await asyncio.sleep(0.2)  # the database path: within 100 ms
                after = await api.get("/v1/models")
    finally:
        await first.aclose()
        await second.aclose()
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert after.status_code == 401
    assert after.json()["error"]["code"] == "invalid_api_key"


async def test_a_member_sees_and_revokes_only_their_own_keys(gateway: GatewayHarness) -> None:
    gateway.store.set_membership("alice", "acme", "admin")
    async with signed_in(gateway, "carol") as member:
        own = await _create(member, name="carol's")
        member_view = (await member.get("/api/keys")).json()["data"]
        async with signed_in(gateway, "alice") as admin:
            admins = await _create(admin, name="alice's")
            admin_view = {k["user_name"] for k in (await admin.get("/api/keys")).json()["data"]}
            not_hers = await member.delete(f"/api/keys/{admins['id']}")
            by_admin = await admin.delete(f"/api/keys/{own['id']}")
    assert {k["user_name"] for k in member_view} == {"carol"}
    assert {"alice", "carol", "dave"} <= admin_view
    assert not_hers.status_code == 404
    assert by_admin.status_code == 200 and by_admin.json()["revoked_at"] is not None


async def test_another_organization_s_keys_are_not_found(gateway: GatewayHarness) -> None:
    gateway.store.set_membership("bob", "ext-org", "admin")
    async with signed_in(gateway, "alice") as http:
        alices = await _create(http)
    async with signed_in(gateway, "bob") as other:
        listing = (await other.get("/api/keys")).json()["data"]
        revoke = await other.delete(f"/api/keys/{alices['id']}")
    assert all(k["user_name"] == "bob" for k in listing)
    assert revoke.status_code == 404
    async with gateway.client(alices["key"]) as api:
        assert (await api.get("/v1/models")).status_code == 200


async def test_scopes_bind_the_api_routes_and_a_session_has_them_all(
    gateway: GatewayHarness,
) -> None:
    async with signed_in(gateway, "alice") as http:
        dedicated_only = (await _create(http, scopes=["dedicated"]))["key"]
        inference_only = (await _create(http, scopes=["inference"]))["key"]
        session_adapters = await http.get("/api/adapters")
    async with gateway.client(dedicated_only) as api:
        refused = await api.get("/api/adapters")
    async with gateway.client(inference_only) as api:
        allowed = await api.get("/api/adapters")
    assert session_adapters.status_code == 200
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "insufficient_scope"
    assert allowed.status_code == 200
