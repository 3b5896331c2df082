"""Adapters checked against their base model before anything stores or loads them
(docs/reference/adapters.md#validation): shapes, layers, modules, rank and alpha; the
stored config is written from the checked facts."""

from __future__ import annotations

import json
import struct

import pytest

from serve_app.adapters.checks import inspect_adapter
from serve_app.contract.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    BaseShapes,
    LoraSettings,
    base_shapes,
)
from serve_app.protocol.errors import InvalidRequestError, RequestTooLargeError
from tests.fixtures.adapters import TINY_BASE, adapter_files

LORA = LoraSettings(max_lora_rank=8, max_loras=2, max_adapter_bytes=64 * 1024)
SMOLLM2_CONFIG = {  # SmolLM2-135M's config.json, the sizes that matter
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
}


def _check(files: dict[str, bytes], base: BaseShapes = TINY_BASE) -> str:
    with pytest.raises(InvalidRequestError) as caught:
        inspect_adapter(files, LORA, base, "base")
    return f"{caught.value.code}: {caught.value.message}"


def _with_config(**changes: object) -> dict[str, bytes]:
    files = adapter_files()
    config = json.loads(files[ADAPTER_CONFIG])
    config.update(changes)
    return {**files, ADAPTER_CONFIG: json.dumps(config).encode()}


def _raw_config(text: str) -> dict[str, bytes]:
    return {**adapter_files(), ADAPTER_CONFIG: text.encode()}


def test_the_base_models_shapes_from_its_config() -> None:
    shapes = base_shapes(SMOLLM2_CONFIG)
    assert shapes is not None and shapes.num_layers == 30
    assert shapes.features("q_proj") == (576, 576) and shapes.features("k_proj") == (576, 192)
    assert shapes.features("down_proj") == (1536, 576)
    moe = base_shapes({**SMOLLM2_CONFIG, "num_experts": 8})
    assert moe is not None and moe.features("gate_proj") is None
    assert base_shapes({"hidden_size": 8}) is None


def test_a_fitting_adapter_is_stored_with_the_servers_config() -> None:
    files = _with_config(
        base_model_name_or_path="/somewhere/else",
        lora_alpha=32,
        layers_pattern="anything",
        inference_mode=False,
        custom_field={"x": 1},
    )
    facts = inspect_adapter(files, LORA, TINY_BASE, "lora-base")
    written = json.loads(facts.files[ADAPTER_CONFIG])
    assert written == {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "lora-base",
        "r": 8,
        "lora_alpha": 32.0,
        "use_rslora": False,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "fan_in_fan_out": False,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "use_dora": False,
    }
    assert facts.files[ADAPTER_WEIGHTS] == files[ADAPTER_WEIGHTS]


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        (adapter_files(width=32), "needs [8, 16]"),  # another model's hidden size
        (adapter_files(layers=3), "layer 2; the base model has 2 layers"),
        (adapter_files(modules=["q_proj", "embed_tokens"]), "unsupported_target_modules"),
        (_with_config(target_modules=["q_proj"]), "differs from the modules"),
        (_with_config(target_modules=["q_proj", "v_proj", "lm_head"]), "does not offer"),
        (_with_config(target_modules="all-linear"), "must list"),
        (_with_config(r=4), "needs [4, 16]"),  # config's rank, tensors' rank 8
        (adapter_files(rank=16), "adapter_rank_too_large"),
        (_with_config(r=0), "positive integer rank"),
        (_with_config(r=True), "positive integer rank"),
        (_with_config(lora_alpha=0), "lora_alpha"),
        (_with_config(lora_alpha=1e9), "lora_alpha"),
        (_with_config(lora_alpha="16"), "lora_alpha"),
        (_raw_config('{"r": 8, "lora_alpha": NaN, "target_modules": ["q_proj"]}'), "NaN"),
        (_raw_config('{"r": 8, "lora_alpha": Infinity}'), "Infinity"),
        (_raw_config('{"r": 8, "lora_alpha": 1e999, "target_modules": []}'), "lora_alpha"),
        (_raw_config("[" * 60_000), "not valid JSON"),  # deep: a RecursionError
        (_with_config(use_dora=True), "unsupported_adapter"),
        (_with_config(modules_to_save=["lm_head"]), "unsupported_adapter"),
        (_with_config(rank_pattern={"q_proj": 4}), "unsupported_adapter"),
        (_with_config(fan_in_fan_out=True), "unsupported_adapter"),
        (_with_config(bias="all"), "unsupported_adapter"),
        (_with_config(peft_type="IA3"), "Only LoRA"),
    ],
)
def test_what_does_not_fit_the_base_model_is_refused_with_the_reason(
    files: dict[str, bytes], reason: str
) -> None:
    assert reason in _check(files)


def _weights(header: dict[str, object], body: bytes) -> dict[str, bytes]:
    raw = json.dumps(header).encode()
    return {**adapter_files(), ADAPTER_WEIGHTS: struct.pack("<Q", len(raw)) + raw + body}


def _pair(layer: int = 0, dtype: str = "F32", a_offsets: tuple[int, int] = (0, 512)) -> dict:
    stem = f"base_model.model.model.layers.{layer}.self_attn.q_proj"
    return {
        f"{stem}.lora_A.weight": {"dtype": dtype, "shape": [8, 16], "data_offsets": a_offsets},
        f"{stem}.lora_B.weight": {"dtype": dtype, "shape": [16, 8], "data_offsets": [512, 1024]},
    }


@pytest.mark.parametrize(
    ("header", "body", "reason"),
    [
        ({}, b"", "holds no LoRA weights"),
        ({"model.embed_tokens.weight": {}}, b"", "is not a LoRA weight"),
        (_pair(a_offsets=(0, 256)), bytes(1024), "data_offsets do not match"),
        (_pair(), bytes(2048), "does not match its header"),  # trailing bytes
        (_pair(dtype="I8"), bytes(1024), "malformed"),
        (
            {k: v for k, v in _pair().items() if "lora_A" in k},
            bytes(512),
            "lack lora_A or lora_B",
        ),
        (
            {
                "base_model.model.model.layers.0.mlp.q_proj.lora_A.weight": {
                    "dtype": "F32",
                    "shape": [8, 16],
                    "data_offsets": [0, 512],
                }
            },
            bytes(512),
            "is under self_attn",
        ),
    ],
)
def test_the_weights_header_is_checked_tensor_by_tensor(
    header: dict[str, object], body: bytes, reason: str
) -> None:
    files = _weights(header, body)
    files[ADAPTER_CONFIG] = json.dumps({"r": 8, "target_modules": ["q_proj"]}).encode()
    assert reason in _check(files)


def test_overlapping_tensors_and_huge_headers_are_refused() -> None:
    pair = _pair()
    pair["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]["data_offsets"] = [
        0,
        512,
    ]
    files = _weights(pair, bytes(512))
    files[ADAPTER_CONFIG] = json.dumps({"r": 8, "target_modules": ["q_proj"]}).encode()
    assert "overlap" in _check(files)
    huge = {ADAPTER_CONFIG: adapter_files()[ADAPTER_CONFIG]}
    huge[ADAPTER_WEIGHTS] = struct.pack("<Q", 2 * 1024 * 1024) + b" " * 1024
    assert "header is larger" in _check(huge)


def test_a_weights_file_over_the_heads_bound_is_refused() -> None:
    files = adapter_files(layers=40, width=64)
    assert len(files[ADAPTER_WEIGHTS]) > LORA.max_adapter_bytes
    with pytest.raises(RequestTooLargeError):
        inspect_adapter(files, LORA, TINY_BASE, "base")
