"""``/api/adapters`` and ``<base>:<adapter>`` ids through the in-process gateway
(docs/reference/adapters.md), on a scripted head that serves adapters: its replies
start with ``[<adapter key>]`` (the adapter's unique id, its LoRA name in the engine)
when generated with one."""

from __future__ import annotations

import bz2
import tarfile
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from serve_app.storage.db import Database
from serve_app.storage.schema import usage_records
from tests.fixtures.adapters import (
    LORA_BASE,
    PLAIN_CHAT,
    adapter_files,
    lora_catalog,
    operator_adapter_dir,
    zipped,
)
from tests.fixtures.gateway import GatewayHarness, HarnessFactory

BASE = LORA_BASE
PLAIN = PLAIN_CHAT
OPS = f"catalog:{BASE}:ops"
"""The operator adapter ``ops``' key."""


@pytest.fixture
async def lora_gateway(
    make_gateway: HarnessFactory, tmp_path: Path, request: pytest.FixtureRequest
) -> GatewayHarness:
    limits = getattr(request, "param", None)
    args: dict[str, Any] = {"catalog": lora_catalog(operator_adapter_dir(tmp_path))}
    if limits:
        args["limits"] = limits
    harness = await make_gateway(args=args)
    harness.keys["admin"] = harness.store.create_key("ann", "acme", role="admin")
    harness.keys["other_admin"] = harness.store.create_key("oz", "other", role="admin")
    return harness


async def _upload(harness: GatewayHarness, key: str, name: str, data: bytes, base: str = BASE):
    async with harness.client(harness.keys[key]) as http:
        return await http.post(
            "/api/adapters",
            data={"name": name, "base_model": base},
            files={"file": ("adapter.zip", data, "application/zip")},
        )


async def _chat(harness: GatewayHarness, key: str, model: str, **extra: Any) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}
    async with harness.client(harness.keys[key]) as http:
        return await http.post("/v1/chat/completions", json=body)


async def test_upload_list_use_and_delete(lora_gateway: GatewayHarness) -> None:
    resp = await _upload(lora_gateway, "admin", "mine", zipped(adapter_files(rank=4)))
    assert resp.status_code == 200, resp.text
    made = resp.json()
    assert made["model"] == f"{BASE}:mine" and made["rank"] == 4
    assert made["target_modules"] == ["q_proj", "v_proj"] and made["source"] == "organization"
    async with lora_gateway.client(lora_gateway.keys["user"]) as http:
        listed = (await http.get("/api/adapters")).json()["data"]
        assert {a["model"]: a["source"] for a in listed} == {
            f"{BASE}:mine": "organization",
            f"{BASE}:ops": "catalog",
            f"{BASE}:priced": "catalog",
        }
        models = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
        assert models[f"{BASE}:mine"]["parent"] == BASE
        assert models[f"{BASE}:ops"]["parent"] == BASE and "parent" not in models[BASE]
        one = await http.get(f"/v1/models/{BASE}:mine")
        assert one.status_code == 200 and one.json()["parent"] == BASE
    reply = await _chat(lora_gateway, "user", f"{BASE}:mine")
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == f"{BASE}:mine"
    assert reply.json()["choices"][0]["message"]["content"].startswith(f"[{made['id']}]")
    base = await _chat(lora_gateway, "user", BASE)
    assert not base.json()["choices"][0]["message"]["content"].startswith("[")
    engine = lora_gateway.engines[BASE]
    assert engine.adapters[made["id"]]["r"] == 4  # the uploaded files reached the head
    async with lora_gateway.client(lora_gateway.keys["admin"]) as http:
        assert (await http.delete("/api/adapters/mine")).status_code == 200
        assert (await http.get("/api/adapters/mine")).status_code == 404
    assert ("unload", made["id"]) in engine.adapter_log  # deleting unloads it
    gone = await _chat(lora_gateway, "user", f"{BASE}:mine")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"


async def test_streams_and_completions_use_the_adapter(lora_gateway: GatewayHarness) -> None:
    client = lora_gateway.openai(lora_gateway.keys["user"])
    stream = await client.chat.completions.create(
        model=f"{BASE}:ops", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text.startswith(f"[{OPS}]")
    completion = await client.completions.create(model=f"{BASE}:ops", prompt="say something")
    assert completion.choices[0].text.startswith(f"[{OPS}]")
    response = await client.responses.create(model=f"{BASE}:ops", input="hi there")
    assert response.output_text.startswith(f"[{OPS}]")


async def test_other_organizations_and_unknown_adapters_are_404(
    lora_gateway: GatewayHarness,
) -> None:
    assert (await _upload(lora_gateway, "admin", "secret", zipped(adapter_files()))).is_success
    answers = [
        await _chat(lora_gateway, "other_admin", f"{BASE}:secret"),
        await _chat(lora_gateway, "user", f"{BASE}:nope"),
        await _chat(lora_gateway, "user", f"{PLAIN}:secret"),  # base serves no adapters
    ]
    assert [a.status_code for a in answers] == [404, 404, 404]
    assert {a.json()["error"]["code"] for a in answers} == {"model_not_found"}
    async with lora_gateway.client(lora_gateway.keys["other_admin"]) as http:
        assert (await http.get("/api/adapters/secret")).status_code == 404
        assert (await http.delete("/api/adapters/secret")).status_code == 404
        models = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
    assert f"{BASE}:secret" not in models and f"{BASE}:ops" in models


async def test_upload_refusals(lora_gateway: GatewayHarness) -> None:
    member = await _upload(lora_gateway, "user", "x", zipped(adapter_files()))
    assert member.status_code == 403 and member.json()["error"]["code"] == "admin_required"
    pickled = zipped({"adapter_config.json": b"{}", "adapter_model.bin": b"\x80\x04K."})
    refused = await _upload(lora_gateway, "admin", "pickled", pickled)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "unsafe_adapter_format"
    big = zipped(adapter_files(layers=60, width=64))  # weights over the 64 KiB bound
    assert (await _upload(lora_gateway, "admin", "big", big)).status_code == 413
    rank = await _upload(lora_gateway, "admin", "wide", zipped(adapter_files(rank=16)))
    assert rank.json()["error"]["code"] == "adapter_rank_too_large"
    plain = await _upload(lora_gateway, "admin", "p", zipped(adapter_files()), base=PLAIN)
    assert plain.json()["error"]["code"] == "adapters_not_supported"
    bad_name = await _upload(lora_gateway, "admin", "Bad:Name", zipped(adapter_files()))
    assert bad_name.status_code == 400
    assert (await _upload(lora_gateway, "admin", "dup", zipped(adapter_files()))).is_success
    again = await _upload(lora_gateway, "admin", "dup", zipped(adapter_files()))
    assert again.status_code == 409
    clash = await _upload(lora_gateway, "admin", "ops", zipped(adapter_files()))
    assert clash.status_code == 409  # the catalog's adapter name on that base
    async with lora_gateway.client(lora_gateway.keys["admin"]) as http:
        names = [a["name"] for a in (await http.get("/api/adapters")).json()["data"]]
    assert names.count("dup") == 1 and "pickled" not in names and "big" not in names


async def test_metered_under_the_adapter_id_at_its_price(
    lora_gateway: GatewayHarness, tmp_path: Path
) -> None:
    for model in (f"{BASE}:ops", f"{BASE}:priced", BASE):
        assert (await _chat(lora_gateway, "user", model, max_tokens=4)).status_code == 200
    await lora_gateway.aclose()  # commit the spooled usage records
    database = Database(f"sqlite:///{tmp_path / 'gw0' / 'gw.db'}")
    with database.connect() as conn:
        rows = conn.execute(sa.select(usage_records)).mappings().all()
    by_model = {r["model"]: r for r in rows}
    assert set(by_model) == {f"{BASE}:ops", f"{BASE}:priced", BASE}
    ops, priced, base = by_model[f"{BASE}:ops"], by_model[f"{BASE}:priced"], by_model[BASE]
    assert ops["prompt_tokens"] == base["prompt_tokens"] > 0
    prices = {m: (r["input_per_mtok"], r["output_per_mtok"]) for m, r in by_model.items()}
    assert prices[f"{BASE}:ops"] == prices[BASE] == (1.0, 2.0)  # priced as the base
    assert prices[f"{BASE}:priced"] == (10.0, 20.0)  # the adapter's own price
    expected = (priced["prompt_tokens"] * 10.0 + priced["completion_tokens"] * 20.0) / 1e6
    assert float(priced["cost"]) == pytest.approx(expected)
    assert float(ops["cost"]) > 0


async def test_three_adapters_on_two_slots_evict_the_least_recently_used(
    lora_gateway: GatewayHarness,
) -> None:
    keys = {}
    for name in ("a1", "a2", "a3"):
        made = await _upload(lora_gateway, "admin", name, zipped(adapter_files()))
        keys[name] = made.json()["id"]
    for name in ("a1", "a2", "a1", "a3", "a2"):
        reply = await _chat(lora_gateway, "user", f"{BASE}:{name}")
        content = reply.json()["choices"][0]["message"]["content"]
        assert content.startswith(f"[{keys[name]}]")
    log = lora_gateway.engines[BASE].adapter_log
    assert log == [
        ("load", keys["a1"]),
        ("load", keys["a2"]),
        ("unload", keys["a2"]),  # a1 was used after a2: a2 is the least recent
        ("load", keys["a3"]),
        ("unload", keys["a1"]),
        ("load", keys["a2"]),
    ]
    assert len(lora_gateway.engines[BASE].adapters) == 2


@pytest.mark.parametrize("lora_gateway", [{"rpm": 2}], indirect=True)
async def test_adapter_calls_count_toward_the_callers_limits(lora_gateway: GatewayHarness) -> None:
    assert (await _chat(lora_gateway, "user", BASE)).status_code == 200
    assert (await _chat(lora_gateway, "user", f"{BASE}:ops")).status_code == 200
    limited = await _chat(lora_gateway, "user", f"{BASE}:ops")  # the third in the minute
    assert limited.status_code == 429, limited.text


async def test_same_name_in_two_organizations_are_two_adapters(
    lora_gateway: GatewayHarness,
) -> None:
    """Names are unique per organization only: each org's calls get its own weights,
    interleaved, and one org's deletion leaves the other's working."""
    mine = await _upload(lora_gateway, "admin", "support", zipped(adapter_files(rank=4)))
    theirs = await _upload(lora_gateway, "other_admin", "support", zipped(adapter_files(rank=8)))
    assert mine.is_success and theirs.is_success, (mine.text, theirs.text)
    key_a, key_b = mine.json()["id"], theirs.json()["id"]
    assert key_a != key_b
    for who, key in (("admin", key_a), ("other_admin", key_b), ("admin", key_a)):
        reply = await _chat(lora_gateway, who, f"{BASE}:support")
        assert reply.json()["model"] == f"{BASE}:support"
        assert reply.json()["choices"][0]["message"]["content"].startswith(f"[{key}]")
    engine = lora_gateway.engines[BASE]
    assert engine.adapters[key_a]["r"] == 4 and engine.adapters[key_b]["r"] == 8
    async with lora_gateway.client(lora_gateway.keys["admin"]) as http:
        assert (await http.delete("/api/adapters/support")).status_code == 200
    assert key_a not in engine.adapters and key_b in engine.adapters
    reply = await _chat(lora_gateway, "other_admin", f"{BASE}:support")
    assert reply.json()["choices"][0]["message"]["content"].startswith(f"[{key_b}]")
    gone = await _chat(lora_gateway, "admin", f"{BASE}:support")
    assert gone.status_code == 404


async def test_a_name_uploaded_again_never_runs_the_old_weights(
    lora_gateway: GatewayHarness,
) -> None:
    first = (await _upload(lora_gateway, "admin", "v", zipped(adapter_files(rank=4)))).json()
    assert (await _chat(lora_gateway, "user", f"{BASE}:v")).status_code == 200
    async with lora_gateway.client(lora_gateway.keys["admin"]) as http:
        assert (await http.delete("/api/adapters/v")).status_code == 200
    second = (await _upload(lora_gateway, "admin", "v", zipped(adapter_files(rank=8)))).json()
    assert second["id"] != first["id"]
    reply = await _chat(lora_gateway, "user", f"{BASE}:v")
    assert reply.json()["choices"][0]["message"]["content"].startswith(f"[{second['id']}]")
    assert lora_gateway.engines[BASE].adapters[second["id"]]["r"] == 8


def _pax_bomb() -> bytes:
    """A pax header declaring 1 GiB (tarfile read that in one call), bzip2'd."""
    info = tarfile.TarInfo("pax")
    info.type = tarfile.XHDTYPE
    info.size = 1 << 30
    return bz2.compress(info.tobuf(tarfile.USTAR_FORMAT) + bytes(8192))


async def test_hostile_archives_and_misfit_adapters_get_the_400_envelope(
    lora_gateway: GatewayHarness,
) -> None:
    """Refused before anything is stored or any engine sees them
    (test_hostile_archives.py and test_checks.py have the rest)."""
    cases = [
        (_pax_bomb(), "unsafe_archive", "extended header declares"),
        (zipped(adapter_files(width=32)), "invalid_adapter", "needs [8, 16]"),
        (zipped(adapter_files(layers=3)), "invalid_adapter", "the base model has 2 layers"),
    ]
    for data, code, reason in cases:
        resp = await _upload(lora_gateway, "admin", "hostile", data)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            code,
            "file",
        )
        assert reason in error["message"]
    assert lora_gateway.engines[BASE].adapter_log == []
    async with lora_gateway.client(lora_gateway.keys["admin"]) as http:
        assert (await http.get("/api/adapters/hostile")).status_code == 404
