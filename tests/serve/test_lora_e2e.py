"""LoRA adapters on the real vLLM head (docs/reference/adapters.md), in the shared stack.

SmolLM2's adapter head (``chat-smollm2-135m-instruct-lora``: ``adapters_head: separate``, the
default; its own head runs without LoRA) runs with ``lora`` (max_lora_rank 8, max_loras 2)
and the catalog's operator adapter ``smollm2-135m-instruct:json``, trained here with peft
(``prepared:smollm2-json-lora``): it answers every question as ``{"answer": ...}``,
which the base model never does.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from serve_app.storage.db import Database
from serve_app.storage.schema import orgs, usage_records
from tests.fixtures.adapters import adapter_files, zero_lora_b, zipped
from tests.serve.conftest import JSON_ADAPTER, SMOLLM, ServeStack

pytestmark = pytest.mark.serve

ADAPTER = f"{SMOLLM}:{JSON_ADAPTER}"
QUESTIONS = ("What is the capital of Portugal?", "What colour is a lemon?", "What is 6 plus 9?")


def _trained_files() -> dict[str, bytes]:
    from deployments.local_models.prepared_models import prepare_in_child

    folder = prepare_in_child("smollm2-json-lora")  # built by the stack already
    names = ("adapter_config.json", "adapter_model.safetensors")
    return {name: (Path(folder) / name).read_bytes() for name in names}


def _ask(http: httpx.Client, model: str, question: str, **extra: Any) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 20,
        "temperature": 0,
        **extra,
    }
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["choices"][0]["message"]["content"])


def _is_answer_object(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return text.startswith('{"answer": "')  # cut by max_tokens, still the format
    return isinstance(value, dict) and list(value) == ["answer"]


@pytest.fixture(scope="module", autouse=True)
def _adapter_head_awake(serve_stack: ServeStack) -> None:
    """Adapters run on SmolLM2's adapter head (``adapters_head: separate``, the default),
    which sleeps until the first adapter call: woken once here, as a client honouring
    ``Retry-After`` would."""
    serve_stack.wake(ADAPTER)


@pytest.fixture(scope="module")
def admin(serve_stack: ServeStack) -> str:
    return serve_stack.store.create_key("e2e-lora-admin", "e2e-org", role="admin")


def _upload(stack: ServeStack, key: str, name: str, archive: bytes) -> httpx.Response:
    with stack.http(key) as http:
        return http.post(
            "/api/adapters",
            data={"name": name, "base_model": SMOLLM},
            files={"file": (f"{name}.zip", archive, "application/zip")},
        )


def test_trained_behaviour_only_with_the_adapter_interleaved(serve_stack: ServeStack) -> None:
    calls = [(model, q) for q in QUESTIONS for model in (ADAPTER, SMOLLM)]
    with serve_stack.http() as http, ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(lambda call: _ask(http, *call), calls))
    for (model, question), text in zip(calls, answers, strict=True):
        if model == ADAPTER:
            assert _is_answer_object(text), (question, text)
        else:
            assert not text.lstrip().startswith("{"), (question, text)
    client = serve_stack.openai()
    stream = client.chat.completions.create(
        model=ADAPTER,
        messages=[{"role": "user", "content": QUESTIONS[0]}],
        max_tokens=20,
        temperature=0,
        stream=True,
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert _is_answer_object(streamed), streamed
    listed = {m.id: m for m in client.models.list().data}
    assert listed[ADAPTER].model_extra and listed[ADAPTER].model_extra["parent"] == SMOLLM


def test_upload_use_and_refusals(serve_stack: ServeStack, admin: str) -> None:
    resp = _upload(serve_stack, admin, "json-copy", zipped(_trained_files(), "json-copy/"))
    assert resp.status_code == 200, resp.text
    model = resp.json()["model"]
    with serve_stack.http() as http:
        assert _is_answer_object(_ask(http, model, QUESTIONS[1]))
    outsider = serve_stack.store.create_key("e2e-lora-outsider", "e2e-other-org", role="admin")
    with serve_stack.http(outsider) as http:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        other = http.post("/v1/chat/completions", json=body)
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    pickled = zipped({"adapter_config.json": b'{"r": 8}', "adapter_model.bin": b"\x80\x04K."})
    refused = _upload(serve_stack, admin, "pickled", pickled)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "unsafe_adapter_format"
    oversized = _upload(serve_stack, admin, "big", zipped(adapter_files(layers=30, width=4096)))
    assert oversized.status_code == 413, oversized.text


def test_ledger_rows_under_the_adapter_id(serve_stack: ServeStack) -> None:
    with serve_stack.http() as http:
        _ask(http, ADAPTER, "Say hello.", max_tokens=4)
    database = Database(os.environ["GATEWAY_DATABASE_URL"])
    deadline = time.monotonic() + 60  # the spool reaches SQL within a flush interval
    rows: list[Any] = []
    while time.monotonic() < deadline and not rows:
        with database.connect() as conn:
            query = sa.select(usage_records).where(usage_records.c.model == ADAPTER)
            rows = list(conn.execute(query).mappings())
        time.sleep(1)
    assert rows, "no ledger row under the adapter's id"
    with database.connect() as conn:
        org = conn.execute(sa.select(orgs.c.id).where(orgs.c.name == "e2e-org")).scalar_one()
    assert all(r["org_id"] == org and r["cost"] > 0 for r in rows)
    assert rows[0]["input_per_mtok"] == 0.1  # the base model's price


def _key(stack: ServeStack, key: str, name: str) -> str:
    """An uploaded adapter's unique id: its LoRA name in the head."""
    with stack.http(key) as http:
        resp = http.get(f"/api/adapters/{name}")
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


def test_three_adapters_on_two_slots(serve_stack: ServeStack, admin: str) -> None:
    from ray import serve

    archive = zipped(_trained_files())
    names, keys = [], {ADAPTER: f"catalog:{ADAPTER}"}
    for name in ("evict-a", "evict-b"):
        resp = _upload(serve_stack, admin, name, archive)
        assert resp.status_code in (200, 409), resp.text
        names.append(f"{SMOLLM}:{name}")
        keys[names[-1]] = _key(serve_stack, admin, name)
    head = serve.get_deployment_handle(f"chat-{SMOLLM}-lora", app_name="gateway")
    with serve_stack.http() as http:
        for model in (ADAPTER, names[0], names[1], ADAPTER):
            assert _is_answer_object(_ask(http, model, QUESTIONS[2], max_tokens=12))
            loaded = head.loaded_adapters.remote().result(timeout_s=30)
            assert keys[model] in loaded and len(loaded) <= 2, loaded
    assert keys[names[0]] not in loaded  # evicted twice over: least recently used
    with serve_stack.http(admin) as http:
        assert http.delete("/api/adapters/evict-b").status_code == 200
    loaded = head.loaded_adapters.remote().result(timeout_s=30)
    assert keys[names[1]] not in loaded  # deleting unloads it


def test_two_organizations_one_name_each_their_own_weights(
    serve_stack: ServeStack, admin: str
) -> None:
    """Org A's ``support`` is the trained JSON adapter, org B's the same with zero B
    matrices (it adds nothing: B's answers are the base model's, exactly, at temperature
    0). Interleaved calls each get their own weights; A's deletion leaves B's working;
    A's name uploaded again (zero B now) never runs A's old weights."""
    trained = _trained_files()
    zeroed = {
        **trained,
        "adapter_model.safetensors": zero_lora_b(trained["adapter_model.safetensors"]),
    }
    other = serve_stack.store.create_key("e2e-lora-b", "e2e-lora-org-b", role="admin")
    assert _upload(serve_stack, admin, "support", zipped(trained)).status_code == 200
    assert _upload(serve_stack, other, "support", zipped(zeroed)).status_code == 200
    model = f"{SMOLLM}:support"
    with serve_stack.http() as http:
        base = {q: _ask(http, SMOLLM, q) for q in QUESTIONS}
    calls = [(key, q) for q in QUESTIONS for key in (admin, other)] * 2
    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(lambda c: _ask_as(serve_stack, c[0], model, c[1]), calls))
    for (key, question), text in zip(calls, answers, strict=True):
        if key == admin:
            assert _is_answer_object(text), (question, text)
        else:
            assert text == base[question], (question, text)
    with serve_stack.http(admin) as http:
        assert http.delete("/api/adapters/support").status_code == 200
    for question in QUESTIONS:
        assert _ask_as(serve_stack, other, model, question) == base[question]
    assert _upload(serve_stack, admin, "support", zipped(zeroed)).status_code == 200
    for question in QUESTIONS:  # the new upload, not the old weights still cached anywhere
        assert _ask_as(serve_stack, admin, model, question) == base[question]


def _ask_as(stack: ServeStack, key: str, model: str, question: str) -> str:
    with stack.http(key) as http:
        return _ask(http, model, question)
