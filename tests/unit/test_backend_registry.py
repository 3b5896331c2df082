"""The one backend registry (``deployments/registry.py``) and everything that reads it.

The factories build from it, the app builder refuses names and engine settings from it,
and ``gateway check`` reports from it; these tests hold each of them to the table, and
hold the table to the engine modules it names.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from deployments import registry
from deployments.audio.base import SpeechEngine, TranscriptionEngine
from deployments.chat.base import TextEngine
from deployments.documents.base import DetectEngine, ParseEngine
from deployments.embeddings.base import PoolingEngine
from deployments.video.base import VideoEngine
from serve_app.config import REPO_ROOT

Build = Callable[..., Any]
Register = Callable[[str, Any], None]
BASES: dict[str, type] = {
    "chat": TextEngine,
    "speech": SpeechEngine,
    "transcription": TranscriptionEngine,
    "detect": DetectEngine,
    "parse": ParseEngine,
    "video": VideoEngine,
    "pooling": PoolingEngine,
}
"""Head kind -> its engine contract, as the heads' own packages define it."""
FACTORIES: dict[str, tuple[type, Build, Register, tuple[Any, ...]]] = {
    head: (
        base,
        functools.partial(registry.build_engine, head),
        functools.partial(registry.register, head),
        ("served",) if head == "pooling" else (),
    )
    for head, base in BASES.items()
}
"""Head kind -> (engine base, the one factory for it, its register, extra build args)."""

HEAD_KINDS_MODULE = "serve_app.contract.head_kinds"


def test_every_head_kind_has_a_factory_and_a_head_deployment() -> None:
    from serve_app.builders import HEAD_DEPLOYMENTS

    assert set(FACTORIES) == set(registry.HEAD_KINDS) == set(HEAD_DEPLOYMENTS)
    assert {head for head, _ in registry.BACKENDS} <= set(registry.HEAD_KINDS)


@pytest.mark.parametrize(("head", "name"), sorted(registry.BACKENDS))
def test_each_entry_names_a_config_class_and_an_engine_of_its_head(head: str, name: str) -> None:
    backend = registry.BACKENDS[(head, name)]  # type: ignore[index]
    config_class = registry.load(backend.config)
    assert isinstance(config_class, type) and issubclass(config_class, BaseModel)
    engine = registry.load(backend.engine)
    assert isinstance(engine, type) and issubclass(engine, FACTORIES[head][0]), backend.engine
    if backend.builder is not None:
        assert callable(registry.load(backend.builder))
    assert backend.runtime, "gateway check needs something to import"


@pytest.mark.parametrize(("head", "name"), sorted(registry.BACKENDS))
def test_each_factory_builds_the_registry_entry_from_its_validated_config(
    head: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The factory of ``head`` hands ``name`` to the entry's engine (or builder) with the
    config validated by the entry's config class, and nothing else decides."""
    backend = registry.BACKENDS[(head, name)]  # type: ignore[index]
    _, build, _, extra = FACTORIES[head]
    built: list[tuple[Any, ...]] = []
    target = backend.builder or backend.engine
    real_load = registry.load

    def load(path: str) -> Any:
        if path == target:
            return lambda *args: built.append(args) or "engine"
        return real_load(path)

    monkeypatch.setattr(registry, "load", load)
    config = _minimal_config(head, name)
    assert build(name, config, *extra) == "engine"
    [(parsed, *rest)] = built
    assert isinstance(parsed, real_load(backend.config))
    assert tuple(rest) == extra


def _minimal_config(head: str, name: str) -> dict[str, Any]:
    """A config each backend's class accepts (some require a model)."""
    if (head, name) == ("speech", "orpheus"):
        return {"vllm": {"model": "/models/unused"}}
    config_class = registry.load(registry.BACKENDS[(head, name)].config)  # type: ignore[index]
    return {"model": "/models/unused"} if "model" in _required(config_class) else {}


def _required(config_class: type[BaseModel]) -> set[str]:
    return {name for name, field in config_class.model_fields.items() if field.is_required()}


@pytest.mark.parametrize("head", sorted(FACTORIES))
def test_each_factory_refuses_an_unknown_name_with_the_registry_message(head: str) -> None:
    _, build, _, extra = FACTORIES[head]
    with pytest.raises(ValueError, match=rf"'nope' is not a {head} engine backend; known: "):
        build("nope", {}, *extra)


@pytest.mark.parametrize("head", sorted(FACTORIES))
def test_a_registered_builder_is_known_to_the_builder_and_used_by_the_factory(
    head: str,
) -> None:
    _, build, register, extra = FACTORIES[head]
    made: list[tuple[Any, ...]] = []
    register("test-only", lambda *args: made.append(args) or "engine")
    try:
        assert registry.is_known(head, "test-only")
        assert registry.validate_config(head, "test-only", {"anything": 1}) is None
        assert build("test-only", {"anything": 1}, *extra) == "engine"
    finally:
        registry.unregister(head, "test-only")
    assert made == [({"anything": 1}, *extra)]
    assert not registry.is_known(head, "test-only")


def test_the_one_factory_builds_against_the_tables_engine_contract() -> None:
    for head, base in BASES.items():
        assert registry.load(registry.head_kind(head).engine) is base


def test_a_class_backend_still_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = registry.build_engine("chat", "tests.fakes.scripted_engine:ScriptedEngine", {})
    assert isinstance(engine, TextEngine)
    with pytest.raises(ValueError, match="is not a TextEngine subclass"):
        registry.build_engine("chat", "tests.fakes.scripted_engine:NoSuchEngine", {})


# ---------------------------------------------------------------- the app builder


def _local_args() -> dict[str, Any]:
    """``configs/local.yaml``'s gateway args with its catalog inlined, so it can be edited."""
    serve_config = yaml.safe_load((REPO_ROOT / "configs" / "local.yaml").read_text())
    args = dict(serve_config["applications"][0]["args"])
    catalog: list[dict[str, Any]] = []
    for path in args.pop("catalog_files"):
        catalog += yaml.safe_load((REPO_ROOT / path).read_text())["models"]
    return {**args, "catalog": catalog}


def _with_engine(model_id: str, edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    args = _local_args()
    [entry] = [e for e in args["catalog"] if e["id"] == model_id]
    entry["engine"] = {**entry["engine"], "config": dict(entry["engine"].get("config", {}))}
    edit(entry["engine"])
    return args


def _first(head: str, backend: str) -> str:
    return next(
        e["id"]
        for e in _local_args()["catalog"]
        if e.get("head", "chat") == head and e.get("engine", {}).get("backend") == backend
    )


def test_a_typo_in_chat_engine_settings_fails_build_gateway_app() -> None:
    from serve_app.builders import build_gateway_app

    chat = _first("chat", "vllm")
    args = _with_engine(chat, lambda engine: engine["config"].update(max_num_seq=4))
    with pytest.raises(ValueError) as caught:
        build_gateway_app(args)
    message = str(caught.value)
    assert message.startswith(f"{chat}: vllm engine settings are invalid: ")
    assert "engine.config.max_num_seq: Extra inputs are not permitted" in message


def test_a_wrong_value_in_document_engine_settings_fails_build_gateway_app() -> None:
    from serve_app.builders import build_gateway_app

    parse = _first("parse", "rapidocr")
    args = _with_engine(parse, lambda engine: engine["config"].update(no_such_setting=True))
    with pytest.raises(ValueError, match=rf"^{parse}: rapidocr engine settings are invalid: "):
        build_gateway_app(args)


def test_an_unknown_chat_backend_fails_build_gateway_app() -> None:
    from serve_app.builders import build_gateway_app

    chat = _first("chat", "vllm")
    args = _with_engine(chat, lambda engine: engine.update(backend="vllm-typo"))
    with pytest.raises(ValueError, match=rf"^{chat}: 'vllm-typo' is not a chat engine backend"):
        build_gateway_app(args)


def test_a_class_backend_passes_build_gateway_app_unvalidated() -> None:
    from serve_app.builders import build_gateway_app

    chat = _first("chat", "vllm")
    args = _with_engine(
        chat,
        lambda engine: engine.update(
            backend="tests.fakes.scripted_engine:ScriptedEngine", config={"free": "form"}
        ),
    )
    for entry in args["catalog"]:
        if entry["id"] == chat:
            entry.pop("adapters", None)  # adapters need engine.config.lora: not this test's
    build_gateway_app(args)


def test_validating_every_shipped_catalog_imports_no_model_runtime() -> None:
    """The gateway validates engine settings without loading vLLM, torch or onnxruntime."""
    script = """
import sys, yaml
from pathlib import Path
from deployments import registry
from serve_app.catalog.config import CatalogModel
for path in sorted(Path("configs/catalog").glob("*.yaml")):
    for entry in yaml.safe_load(path.read_text())["models"]:
        model = CatalogModel.model_validate(entry)
        if not model.is_external:
            registry.validate_config(model.head, model.engine.backend, model.engine.config)
heavy = sorted(
    m for m in ("vllm", "torch", "onnxruntime", "diffusers", "transformers", "faster_whisper")
    if m in sys.modules
)
print(",".join(heavy))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "", f"imported: {done.stdout.strip()}"


def test_the_registry_module_imports_nothing_heavy() -> None:
    tree = ast.parse(Path(registry.__file__).read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    light = {"__future__", "importlib", "collections", "dataclasses", "typing"}
    # The table of head kinds: the contract, which imports only itself and pydantic.
    assert {name.split(".")[0] for name in imported if name != HEAD_KINDS_MODULE} <= light
