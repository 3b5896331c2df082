"""The ``lora`` block: vLLM's engine args, the catalog's rules, ids, what `gateway run`
prepares, and the head's slots (docs/reference/adapters.md#serving)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from deployments.chat.adapters import AdapterFiles, AdapterSlots
from deployments.chat.vllm_config import VLLMEngineConfig
from serve_app.catalog.config import CatalogModel
from serve_app.cli.serve import prepared_models
from serve_app.contract.adapters import AdapterRef, split_adapter_id

CHAT = {"head": "chat", "context_length": 64, "max_output_tokens": 8}


def test_lora_settings_become_vllm_engine_args() -> None:
    config = VLLMEngineConfig(model="m", lora={"max_lora_rank": 8, "max_loras": 3})
    kwargs = config.engine_kwargs("cpu", "/models/m")
    assert kwargs["enable_lora"] is True
    assert (kwargs["max_lora_rank"], kwargs["max_loras"], kwargs["max_cpu_loras"]) == (8, 3, 3)
    assert "enable_lora" not in VLLMEngineConfig(model="m").engine_kwargs("cpu", "/m")
    with pytest.raises(ValidationError):
        VLLMEngineConfig(model="m", lora={"max_lora_rank": 12})  # not a rank vLLM sizes for


def test_catalog_adapters_need_a_lora_head_and_unique_names() -> None:
    lora = {"backend": "vllm", "config": {"model": "m", "lora": {"max_lora_rank": 8}}}
    adapter = {"name": "json", "path": "prepared:smollm2-json-lora"}
    CatalogModel.model_validate({"id": "a", **CHAT, "engine": lora, "adapters": [adapter]})
    with pytest.raises(ValidationError):
        CatalogModel.model_validate({"id": "a", **CHAT, "adapters": [adapter]})
    with pytest.raises(ValidationError):
        CatalogModel.model_validate(
            {"id": "a", **CHAT, "engine": lora, "adapters": [adapter, adapter]}
        )
    with pytest.raises(ValidationError):
        CatalogModel.model_validate(
            {"id": "a", **CHAT, "engine": lora, "adapters": [{"name": "Bad:x", "path": "p"}]}
        )


def test_adapter_ids() -> None:
    assert split_adapter_id("smollm2-135m-instruct:json") == ("smollm2-135m-instruct", "json")
    assert split_adapter_id("org/model:v1.2") == ("org/model", "v1.2")
    for plain in ("smollm2", "model:spot", ":json", "model:Bad", "model:"):
        assert split_adapter_id(plain) is None


def test_gateway_run_prepares_packaged_adapters() -> None:
    entry = {
        "id": "s",
        **CHAT,
        "engine": {"config": {"model": "prepared:smollm2-135m-instruct", "lora": {}}},
        "adapters": [{"name": "json", "path": "prepared:smollm2-json-lora"}],
    }
    config = {
        "applications": [{"import_path": "serve_app.builders:x", "args": {"catalog": [entry]}}]
    }
    assert prepared_models(config) == ["smollm2-135m-instruct", "smollm2-json-lora"]


class _Engine:
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    async def load_adapter(self, model_id: str, path: str) -> None:
        self.log.append(("load", model_id))

    async def unload_adapter(self, model_id: str) -> None:
        self.log.append(("unload", model_id))


async def test_an_adapter_in_use_is_unloaded_when_its_last_request_ends(tmp_path: Path) -> None:
    engine = _Engine()
    slots = AdapterSlots(engine, AdapterFiles(None, tmp_path), max_loaded=1)
    a, b = (AdapterRef(key=k, model_id=f"m:{k}", path=str(tmp_path)) for k in ("a", "b"))
    await slots.load(a)
    async with slots.using(a):
        await slots.load(b)  # evicts a while it generates: a stays in the engine
        assert ("unload", "a") not in engine.log and slots.loaded == ["b"]
    assert engine.log == [("load", "a"), ("load", "b"), ("unload", "a")]
    async with slots.using(b):
        await slots.load(a)  # b in use: drained later; a asked again while draining
        await slots.load(b)  # back before it was unloaded: not loaded twice
    assert engine.log.count(("load", "b")) == 1
    assert await slots.forget("b") == "unloaded" and ("unload", "b") in engine.log


async def test_slots_key_adapters_by_their_unique_id_not_their_name(tmp_path: Path) -> None:
    """Two organizations' ``m:support``, or one name deleted and uploaded again on a
    replica that missed the deletion: different adapters, each loaded under its key."""
    engine = _Engine()
    slots = AdapterSlots(engine, AdapterFiles(None, tmp_path), max_loaded=2)
    org_a, org_b = (AdapterRef(key=k, model_id="m:support", path=str(tmp_path)) for k in "AB")
    await slots.load(org_a)
    await slots.load(org_b)  # the same name: loaded again, under its own key
    assert engine.log == [("load", "A"), ("load", "B")] and slots.loaded == ["A", "B"]
    async with slots.using(org_a):
        await slots.load(org_a)  # its own slot, reused
    assert engine.log == [("load", "A"), ("load", "B")] and slots.loaded == ["B", "A"]
    assert await slots.forget("A") == "unloaded"
    assert slots.loaded == ["B"] and engine.log[-1] == ("unload", "A")
