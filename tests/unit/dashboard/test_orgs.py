"""``/api/orgs/current`` with a dashboard session: members and admins, switches,
removal (docs/reference/dashboard.md#organization)."""

from __future__ import annotations

import pytest

from serve_app.auth.principal import Principal
from tests.fixtures.dashboard import PASSWORD, browser, sign_in, signed_in
from tests.fixtures.gateway import GatewayHarness


@pytest.fixture
def acme(gateway: GatewayHarness) -> GatewayHarness:
    """alice admin of acme; carol and dave members; bob in ext-org."""
    gateway.store.set_membership("alice", "acme", "admin")
    return gateway


def _principal(harness: GatewayHarness, raw: str) -> Principal:
    stored = harness.store.find_key(harness.store.hash(raw))
    assert stored is not None and stored.principal is not None
    return stored.principal


def _user_id(harness: GatewayHarness, name: str) -> str:
    user = harness.store.get_user(name)
    assert user is not None
    return user.id


async def test_any_member_reads_the_organization(acme: GatewayHarness) -> None:
    async with signed_in(acme, "carol") as http:
        resp = await http.get("/api/orgs/current")
    body = resp.json()
    assert resp.status_code == 200
    assert body["name"] == "acme" and body["role"] == "member"
    assert body["flags"] == {
        "web_search_enabled": False,
        "web_fetch_enabled": False,
        "code_interpreter_enabled": False,
        "external_providers_enabled": False,
    }
    roles = {m["name"]: m["role"] for m in body["members"]}
    assert roles == {"alice": "admin", "carol": "member", "dave": "member"}


async def test_only_admins_write(acme: GatewayHarness) -> None:
    carol = _user_id(acme, "carol")
    async with signed_in(acme, "carol") as http:
        answers = [
            await http.patch("/api/orgs/current", json={"web_search_enabled": True}),
            await http.post("/api/orgs/current/members", json={"username": "eve"}),
            await http.patch(f"/api/orgs/current/members/{carol}", json={"role": "admin"}),
            await http.delete(f"/api/orgs/current/members/{carol}"),
        ]
    for resp in answers:
        assert resp.status_code == 403
        assert resp.json()["error"]["code"] == "insufficient_permissions"
    assert acme.store.get_user("eve") is None


async def test_an_admin_switches_tools_on_for_every_member(acme: GatewayHarness) -> None:
    carol_key = acme.store.create_key("carol", "acme")
    assert not _principal(acme, carol_key).web_search_enabled
    async with signed_in(acme, "alice") as http:
        no_csrf = await http.patch(
            "/api/orgs/current",
            json={"web_search_enabled": True},
            headers={"X-CSRF-Token": ""},
        )
        resp = await http.patch(
            "/api/orgs/current",
            json={"web_search_enabled": True, "external_providers_enabled": True},
        )
        wrong_type = await http.patch("/api/orgs/current", json={"web_fetch_enabled": "yes"})
    assert no_csrf.status_code == 403
    assert resp.status_code == 200
    assert resp.json()["flags"]["web_search_enabled"] is True
    assert resp.json()["flags"]["external_providers_enabled"] is True
    principal = _principal(acme, carol_key)
    assert principal.web_search_enabled and principal.external_providers_enabled
    assert not principal.web_fetch_enabled
    assert wrong_type.status_code == 400


async def test_adding_members(acme: GatewayHarness) -> None:
    async with signed_in(acme, "alice") as http:
        new = await http.post(
            "/api/orgs/current/members",
            json={"username": "eve", "role": "member", "password": PASSWORD},
        )
        existing = await http.post("/api/orgs/current/members", json={"username": "bob"})
        password_for_existing = await http.post(
            "/api/orgs/current/members", json={"username": "bob", "password": "take over bob"}
        )
        twice = await http.post("/api/orgs/current/members", json={"username": "carol"})
        bad_role = await http.post(
            "/api/orgs/current/members", json={"username": "zed", "role": "owner"}
        )
    assert new.status_code == 201 and new.json()["name"] == "eve"
    assert existing.status_code == 201 and existing.json()["role"] == "member"
    assert password_for_existing.status_code == 409
    assert password_for_existing.json()["error"]["code"] in ("user_exists", "already_member")
    assert twice.status_code == 409 and twice.json()["error"]["code"] == "already_member"
    assert bad_role.status_code == 400
    async with browser(acme) as eve:
        body = await sign_in(eve, "eve")
    assert body["org"]["name"] == "acme"


async def test_roles_and_the_last_admin(acme: GatewayHarness) -> None:
    alice, carol = _user_id(acme, "alice"), _user_id(acme, "carol")
    async with signed_in(acme, "alice") as http:
        last = await http.patch(f"/api/orgs/current/members/{alice}", json={"role": "member"})
        remove_last = await http.delete(f"/api/orgs/current/members/{alice}")
        promoted = await http.patch(f"/api/orgs/current/members/{carol}", json={"role": "admin"})
        demoted = await http.patch(f"/api/orgs/current/members/{alice}", json={"role": "member"})
        now = await http.get("/api/session")
    assert last.status_code == 409 and last.json()["error"]["code"] == "last_admin"
    assert remove_last.status_code == 409
    assert promoted.status_code == 200 and promoted.json()["role"] == "admin"
    assert demoted.status_code == 200
    assert now.json()["org"]["role"] == "member"  # a role change applies to the next request


async def test_removing_a_member_revokes_their_keys_and_ends_their_sessions(
    acme: GatewayHarness,
) -> None:
    acme.store.set_membership("carol", "other-org", "member")
    here = acme.store.create_key("carol", "acme")
    elsewhere = acme.store.create_key("carol", "other-org")
    carol = _user_id(acme, "carol")
    async with signed_in(acme, "carol") as carols, signed_in(acme, "alice") as admin:
        assert (await carols.get("/api/session")).json()["org"]["name"] == "acme"
        removed = await admin.delete(f"/api/orgs/current/members/{carol}")
        again = await admin.delete(f"/api/orgs/current/members/{carol}")
        session_after = await carols.get("/api/session")
        members = (await admin.get("/api/orgs/current")).json()["members"]
    assert removed.status_code == 204 and again.status_code == 404
    assert session_after.status_code == 401
    assert all(m["name"] != "carol" for m in members)
    async with acme.client(here) as api:
        assert (await api.get("/v1/models")).status_code == 401
    async with acme.client(elsewhere) as api:
        assert (await api.get("/v1/models")).status_code == 200
    async with browser(acme) as http:
        body = await sign_in(http, "carol")
    assert [o["name"] for o in body["orgs"]] == ["other-org"]


async def test_another_organization_cannot_be_touched(acme: GatewayHarness) -> None:
    acme.store.set_membership("bob", "ext-org", "admin")
    carol = _user_id(acme, "carol")
    async with signed_in(acme, "bob") as other:
        view = (await other.get("/api/orgs/current")).json()
        remove = await other.delete(f"/api/orgs/current/members/{carol}")
        promote = await other.patch(f"/api/orgs/current/members/{carol}", json={"role": "admin"})
    assert view["name"] == "ext-org"
    assert {m["name"] for m in view["members"]} == {"bob"}
    assert remove.status_code == 404 and promote.status_code == 404
    async with signed_in(acme, "alice") as http:
        members = (await http.get("/api/orgs/current")).json()["members"]
    roles = {m["name"]: m["role"] for m in members}
    assert roles["carol"] == "member"


async def test_the_ray_dashboard_is_for_platform_admins(acme: GatewayHarness) -> None:
    async with signed_in(acme, "alice") as http:
        org_admin = await http.get("/api/admin/ray-dashboard")
    acme.store.set_membership("root", "platform", "admin")
    acme.store.update_org("platform", internal=True)
    async with signed_in(acme, "root") as http:
        platform = await http.get("/api/admin/ray-dashboard")
    assert org_admin.status_code == 403
    assert platform.status_code == 200
    assert platform.json()["url"].startswith("http")
    assert (
        "auth_token" in platform.json()["token_hint"] or "RAY_AUTH" in platform.json()["token_hint"]
    )


async def test_undeclared_methods_and_paths_of_the_session_areas(acme: GatewayHarness) -> None:
    async with signed_in(acme, "alice") as http:
        put = await http.put("/api/orgs/current", json={})
        unknown = await http.get("/api/billing/invoices")
    async with acme.client(acme.keys["user"]) as api:
        with_key = await api.get("/api/billing/invoices")
        put_with_key = await api.put("/api/orgs/current", json={})
    assert put.status_code == put_with_key.status_code == 405
    assert put.headers["allow"] == "GET, HEAD, PATCH, OPTIONS"
    assert unknown.status_code == 404
    assert with_key.status_code == 403 and with_key.json()["error"]["code"] == "session_required"
