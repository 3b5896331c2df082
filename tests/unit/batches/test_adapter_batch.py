"""Batch lines naming a LoRA adapter (``<base>:<adapter>``): validated and run like the
synchronous call on it (docs/reference/adapters.md#batches), on SQLite and PostgreSQL.

The scripted head serving adapters starts a reply generated with one with
``[<adapter key>]`` (its unique id) and records the adapter's config it loaded
(``tests.fakes``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.adapters import (
    LORA_BASE,
    PLAIN_CHAT,
    adapter_files,
    lora_catalog,
    operator_adapter_dir,
    zipped,
)
from tests.unit.batches.conftest import BatchHarness, make_batch_harness

MINE = f"{LORA_BASE}:mine"


async def _key(harness: BatchHarness, model: str) -> str:
    """The adapter's unique id (its LoRA name in the engine): an upload's ``lora-...``
    id, an operator adapter's ``catalog:<model>``."""
    if model != MINE:
        return f"catalog:{model}"
    async with harness.client("admin") as http:
        return str((await http.get("/api/adapters/mine")).json()["id"])


def _line(custom_id: str, model: str, url: str = "/v1/chat/completions") -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": 4}
    if url == "/v1/completions":
        body["prompt"] = "say something"
    else:
        body["messages"] = [{"role": "user", "content": "hello"}]
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


@pytest.fixture
async def lora_batches(tmp_path: Path, database_url: str) -> AsyncIterator[BatchHarness]:
    """Batches on the LoRA catalog; ``acme`` (alice's organization) uploaded ``mine``
    (rank 4); ``other`` is another organization with an admin key."""
    args = {"catalog": lora_catalog(operator_adapter_dir(tmp_path))}
    harness = await make_batch_harness(tmp_path, database_url, args)
    store = harness.gw.store
    harness.gw.keys["admin"] = store.create_key("ann", "acme", role="admin")
    harness.gw.keys["other"] = store.create_key("oz", "other", role="admin")
    async with harness.client("admin") as http:
        uploaded = await http.post(
            "/api/adapters",
            data={"name": "mine", "base_model": LORA_BASE},
            files={"file": ("a.zip", zipped(adapter_files(rank=4)), "application/zip")},
        )
    assert uploaded.status_code == 200, uploaded.text
    yield harness
    await harness.gw.aclose()
    harness.database.dispose()


async def test_adapter_lines_run_like_the_synchronous_call_billed_under_the_adapter(
    lora_batches: BatchHarness,
) -> None:
    models = {"own": MINE, "ops": f"{LORA_BASE}:ops", "priced": f"{LORA_BASE}:priced"}
    lines = [_line(cid, model) for cid, model in models.items()]
    lines.append(_line("base", LORA_BASE))
    created = await lora_batches.create(lines)
    await lora_batches.worker.drain()
    done = await lora_batches.get(created["id"])
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    outputs = {o["custom_id"]: o for o in await lora_batches.content(done["output_file_id"])}
    async with lora_batches.client() as http:
        for cid, model in models.items():
            body = outputs[cid]["response"]["body"]
            assert body["model"] == model
            text = body["choices"][0]["message"]["content"]
            assert text.startswith(f"[{await _key(lora_batches, model)}]")  # the adapter
            live = (await http.post("/v1/chat/completions", json=_line(cid, model)["body"])).json()
            assert live["choices"][0]["message"]["content"] == text
    base_text = outputs["base"]["response"]["body"]["choices"][0]["message"]["content"]
    assert not base_text.startswith("[")
    mine = await _key(lora_batches, MINE)
    assert ("load", mine) in lora_batches.gw.engines[LORA_BASE].adapter_log

    # One record per line, under the adapter's id, at its price times the discount.
    records = {r.request_id: r for r in lora_batches.ledger() if r.batch_id == created["id"]}
    by_model = {r.model: r for r in records.values()}
    assert set(by_model) == {*models.values(), LORA_BASE}
    assert {r.request_id for r in by_model.values()} == {o["id"] for o in outputs.values()}
    for model, record in by_model.items():
        assert record.batch_discount == 0.5 and record.route == "chat"
        own = model == models["priced"]
        assert (record.input_per_mtok, record.output_per_mtok) == (
            (10.0, 20.0) if own else (1.0, 2.0)
        )
        full = record.prompt_tokens * record.input_per_mtok / 1e6
        full += record.completion_tokens * record.output_per_mtok / 1e6
        assert record.cost == pytest.approx(full * 0.5) and record.cost > 0


async def test_completions_batches_take_adapters_too(lora_batches: BatchHarness) -> None:
    url = "/v1/completions"
    created = await lora_batches.create([_line("c", MINE, url)], endpoint=url)
    await lora_batches.worker.drain()
    done = await lora_batches.get(created["id"])
    [output] = await lora_batches.content(done["output_file_id"])
    text = output["response"]["body"]["choices"][0]["text"]
    assert text.startswith(f"[{await _key(lora_batches, MINE)}]")


@pytest.mark.parametrize(
    "model",
    [f"{LORA_BASE}:nope", f"{PLAIN_CHAT}:mine", f"{LORA_BASE}:mine"],
    ids=["unknown", "base-without-adapters", "other-orgs"],
)
async def test_an_adapter_the_owner_may_not_use_fails_validation_on_its_line(
    lora_batches: BatchHarness, model: str
) -> None:
    """``other`` names acme's adapter: the same 404 ``model_not_found`` as unknown ids."""
    who = "other" if model == MINE else "user"
    lines = [_line("ok", f"{LORA_BASE}:ops"), _line("bad", model)]
    created = await lora_batches.create(lines, who=who)
    await lora_batches.worker.drain()
    failed = await lora_batches.get(created["id"], who=who)
    assert failed["status"] == "failed"
    [error] = failed["errors"]["data"]
    assert (error["code"], error["line"], error["param"]) == ("model_not_found", 2, "body.model")
    assert model in error["message"]
    assert lora_batches.gw.engines[LORA_BASE].adapter_log == []  # nothing ran


async def test_an_adapter_deleted_after_validation_fails_its_lines_like_a_live_call(
    lora_batches: BatchHarness,
) -> None:
    created = await lora_batches.create([_line("gone", MINE), _line("ops", f"{LORA_BASE}:ops")])
    assert await lora_batches.worker.run_stage()  # validated: the lines are queued
    async with lora_batches.client("admin") as http:
        assert (await http.delete("/api/adapters/mine")).status_code == 200
    await lora_batches.worker.drain()
    done = await lora_batches.get(created["id"])
    assert done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    [error] = await lora_batches.content(done["error_file_id"])
    assert error["custom_id"] == "gone" and error["response"]["status_code"] == 404
    assert error["response"]["body"]["error"]["code"] == "model_not_found"
    billed = {r.model for r in lora_batches.ledger() if r.batch_id == created["id"]}
    assert billed == {f"{LORA_BASE}:ops"}
