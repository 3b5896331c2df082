"""``/api/billing`` with a dashboard session: the ledger's figures, by group, per role,
as CSV, and the quotas (docs/reference/dashboard.md#billing)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

from serve_app.billing.store import LedgerStore
from tests.fixtures.dashboard import signed_in
from tests.fixtures.gateway import GatewayHarness, HarnessFactory


async def _chat(harness: GatewayHarness, key: str, model: str = "scripted-chat") -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    async with harness.client(key) as api:
        resp = await api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text


async def _traffic(harness: GatewayHarness) -> dict[str, str]:
    """alice (admin) twice on scripted-chat and once on scripted-spot, carol once; bob (another
    org) once. Committed to the ledger."""
    harness.store.set_membership("alice", "acme", "admin")
    carol = harness.store.create_key("carol", "acme")
    for key, model in (
        (harness.keys["user"], "scripted-chat"),
        (harness.keys["user"], "scripted-chat"),
        (harness.keys["user"], "scripted-spot"),
        (carol, "scripted-chat"),
        (harness.keys["external"], "scripted-chat"),
    ):
        await _chat(harness, key, model)
    ledger = harness.metering.ledger
    assert ledger is not None
    await ledger.flush()
    return {"carol": carol}


def _ledger_totals(harness: GatewayHarness, user: str) -> tuple[int, int, float]:
    found = harness.store.get_user(user)
    assert found is not None
    records = LedgerStore(harness.store.database).records_for(found.id)
    return (
        sum(r.prompt_tokens for r in records),
        sum(r.completion_tokens for r in records),
        sum(r.cost for r in records),
    )


async def test_an_admin_sees_the_organization_by_model_and_user(gateway: GatewayHarness) -> None:
    await _traffic(gateway)
    async with signed_in(gateway, "alice") as http:
        by_model = (await http.get("/api/billing/usage", params={"group_by": "model"})).json()
        by_user = (await http.get("/api/billing/usage", params={"group_by": "user"})).json()
    models = {row["group"]: row for row in by_model["data"]}
    assert set(models) == {"scripted-chat", "scripted-spot"}
    assert models["scripted-chat"]["requests"] == 3 and models["scripted-spot"]["requests"] == 1
    users = {row["group"]: row for row in by_user["data"]}
    assert set(users) == {"alice", "carol"}  # bob's org is not in acme's figures
    for name in ("alice", "carol"):
        prompt, completion, cost = _ledger_totals(gateway, name)
        assert users[name]["prompt_tokens"] == prompt
        assert users[name]["completion_tokens"] == completion
        assert users[name]["total_tokens"] == prompt + completion
        assert abs(users[name]["cost_usd"] - cost) < 1e-6
    assert by_user["total"]["requests"] == 4
    assert by_user["total"] == {
        **{k: sum(r[k] for r in by_user["data"]) for k in by_user["total"] if k != "cost_usd"},
        "cost_usd": by_user["total"]["cost_usd"],
    }


async def test_a_member_sees_only_their_own_usage(gateway: GatewayHarness) -> None:
    await _traffic(gateway)
    async with signed_in(gateway, "carol") as http:
        by_user = (await http.get("/api/billing/usage", params={"group_by": "user"})).json()
        by_day = (await http.get("/api/billing/usage")).json()
    assert [row["group"] for row in by_user["data"]] == ["carol"]
    today = datetime.now(UTC).date().isoformat()
    assert by_day["group_by"] == "day" and [row["group"] for row in by_day["data"]] == [today]
    assert by_day["data"][0]["requests"] == 1


async def test_by_key_and_date_range(gateway: GatewayHarness) -> None:
    await _traffic(gateway)
    today = datetime.now(UTC).date()
    async with signed_in(gateway, "alice") as http:
        by_key = (await http.get("/api/billing/usage", params={"group_by": "key"})).json()
        past = await http.get(
            "/api/billing/usage",
            params={"start": str(today - timedelta(days=9)), "end": str(today - timedelta(days=1))},
        )
        reversed_range = await http.get(
            "/api/billing/usage", params={"start": str(today), "end": str(today - timedelta(1))}
        )
        bad_group = await http.get("/api/billing/usage", params={"group_by": "org"})
        bad_date = await http.get("/api/billing/usage", params={"start": "yesterday"})
    assert len(by_key["data"]) == 2 and all(r["group"].startswith("key_") for r in by_key["data"])
    assert past.status_code == 200 and past.json()["data"] == []
    assert past.json()["total"]["requests"] == 0
    for resp in (reversed_range, bad_group, bad_date):
        assert resp.status_code == 400


async def test_csv_export_has_the_same_rows(gateway: GatewayHarness) -> None:
    await _traffic(gateway)
    async with signed_in(gateway, "alice") as http:
        report = (await http.get("/api/billing/usage", params={"group_by": "model"})).json()
        resp = await http.get("/api/billing/usage.csv", params={"group_by": "model"})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/csv")
    assert "attachment" in resp.headers["content-disposition"]
    rows: list[dict[str, Any]] = list(csv.DictReader(io.StringIO(resp.text)))
    assert [r["model"] for r in rows] == [r["group"] for r in report["data"]]
    for row, item in zip(rows, report["data"], strict=True):
        assert int(row["total_tokens"]) == item["total_tokens"]
        assert float(row["cost_usd"]) == item["cost_usd"]


async def test_billing_refuses_keys_and_anonymous_callers(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as api:
        with_key = await api.get("/api/billing/usage")
        csv_key = await api.get("/api/billing/usage.csv")
    async with gateway.client() as anonymous:
        without = await anonymous.get("/api/billing/quotas")
    assert with_key.status_code == csv_key.status_code == 403
    assert with_key.json()["error"]["code"] == "session_required"
    assert without.status_code == 401


async def test_quotas_show_what_is_left(make_gateway: HarnessFactory) -> None:
    harness = await make_gateway(args={"limits": {"daily_tokens": 10_000, "rpm": 50}})
    harness.store.update_user("alice", tpm=777)
    await _chat(harness, harness.keys["user"])
    ledger = harness.metering.ledger
    assert ledger is not None
    await ledger.flush()
    prompt, completion, _ = _ledger_totals(harness, "alice")
    async with signed_in(harness, "alice") as http:
        quotas = (await http.get("/api/billing/quotas")).json()
    assert quotas == {
        "daily_tokens": {
            "limit": 10_000,
            "used": prompt + completion,
            "remaining": 10_000 - prompt - completion,
        },
        "rpm": 50,
        "tpm": 777,
    }
