"""Catalog entries of the vision chat models agree with the engines that serve them.

The gateway enforces ``max_images_per_request`` before a request reaches the
engine, and vLLM refuses prompts over ``limit_mm_per_prompt``: the two must be
the same number, or requests the catalog allows would fail inside the engine.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from deployments.chat.vllm_config import VLLMEngineConfig
from serve_app.catalog.config import CatalogModel
from serve_app.config import REPO_ROOT

CATALOGS = sorted((REPO_ROOT / "configs" / "catalog").glob("*.yaml"))


def _image_chat_models(path: Path) -> list[CatalogModel]:
    entries = yaml.safe_load(path.read_text())["models"]
    return [
        model
        for model in map(CatalogModel.model_validate, entries)
        if model.head == "chat" and not model.is_external and "image" in model.input_modalities
    ]


@pytest.mark.parametrize("path", CATALOGS, ids=lambda p: p.name)
def test_every_catalog_serves_a_vision_chat_model(path: Path) -> None:
    assert _image_chat_models(path), f"{path.name} lists no chat model that takes images"


@pytest.mark.parametrize("path", CATALOGS, ids=lambda p: p.name)
def test_image_limit_is_the_engines_own(path: Path) -> None:
    for model in _image_chat_models(path):
        engine = VLLMEngineConfig.model_validate(model.engine.config)
        limits = engine.engine_args.get("limit_mm_per_prompt", {})
        assert model.max_images_per_request is not None, model.id
        assert limits.get("image") == model.max_images_per_request, model.id


@pytest.mark.parametrize("path", CATALOGS, ids=lambda p: p.name)
def test_vision_engine_args_are_vllm_engine_args(path: Path) -> None:
    vllm = pytest.importorskip("vllm")
    known = {f.name for f in dataclasses.fields(vllm.AsyncEngineArgs)}
    for model in _image_chat_models(path):
        engine = VLLMEngineConfig.model_validate(model.engine.config)
        kwargs = engine.engine_kwargs("cuda" if engine.device == "cuda" else "cpu", "folder")
        assert set(kwargs) <= known, f"{model.id}: {sorted(set(kwargs) - known)}"


def test_local_vision_model_is_the_marked_demo() -> None:
    (model,) = _image_chat_models(REPO_ROOT / "configs" / "catalog" / "local.yaml")
    assert model.tier == "demo"
    assert model.notice and "random" in model.notice
    assert model.engine.config["model"] == "prepared:smolvlm-tiny"
    assert model.engine.config["enforce_eager"] is True


def test_an_image_limit_needs_image_input() -> None:
    entry = {
        "id": "text-only",
        "head": "chat",
        "context_length": 64,
        "max_output_tokens": 16,
        "max_images_per_request": 2,
    }
    with pytest.raises(ValidationError, match="without image input"):
        CatalogModel.model_validate(entry)
    CatalogModel.model_validate({**entry, "input_modalities": ["text", "image"]})
