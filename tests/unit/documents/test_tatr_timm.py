"""Table Transformer as published: a config with ``use_timm_backbone: true``.

microsoft/table-transformer-detection's config asks transformers for a timm ResNet, so the
production detect head needs ``timm``. The tiny ``tiny:table-transformer-timm`` model is saved
with the same legacy config keys. Loading it needs timm, whose wheels bring the CUDA
torchvision: it runs where ``.[gpu]`` is installed and is skipped on the CPU machines, where
``gateway check`` instead names the missing library (tested here everywhere).
"""

from __future__ import annotations

import asyncio
import importlib
import json
from pathlib import Path

import pytest
from PIL import Image

from deployments import registry
from deployments.local_models.tiny_document_models import ensure_tiny
from serve_app.catalog.config import CatalogModel
from serve_app.cli.check import check_model
from serve_app.settings import GatewaySettings


def _timm_error() -> str | None:
    try:
        importlib.import_module("timm")
    except Exception as exc:  # missing, or a torchvision that does not match torch
        return f"{type(exc).__name__}: {exc}"
    return None


def _tatr(model: str) -> CatalogModel:
    return CatalogModel.model_validate(
        {
            "id": "tatr",
            "head": "detect",
            "pricing": {"per_image": 0.001},
            "engine": {"backend": "table-transformer", "config": {"model": model}},
        }
    )


def test_gateway_check_names_timm_exactly_when_it_cannot_be_imported(tmp_path: Path) -> None:
    problems = check_model(
        _tatr("tiny:table-transformer-timm"),
        GatewaySettings(state_dir=tmp_path),
        hub_allowed=False,
    )
    named = [p for p in problems if "cannot import timm" in p.problem]
    assert bool(named) == (_timm_error() is not None), problems
    assert all("pip install timm" in p.fix for p in named)
    assert not [p for p in problems if p not in named], problems


def test_the_detect_head_loads_a_timm_backbone_config(tmp_path: Path) -> None:
    error = _timm_error()
    if error is not None:
        pytest.skip(f"timm unusable here ({error}); runs where .[gpu] is installed")
    folder = ensure_tiny("table-transformer-timm", tmp_path / "tiny-table-transformer-timm")
    saved = json.loads((folder / "config.json").read_text())
    assert saved["use_timm_backbone"] is True and "backbone_config" not in saved
    engine = registry.build_engine(
        "detect", "table-transformer", {"model": str(folder), "device": "cpu", "threshold": 0.0}
    )

    async def detect() -> list[object]:
        await engine.start()
        return list(await engine.detect(Image.new("RGB", (200, 120), "white")))

    regions = asyncio.run(detect())
    assert engine.hf.model.config.backbone_config.model_type == "timm_backbone"  # type: ignore[attr-defined]
    assert regions, "threshold 0 keeps every query's box"
