"""A real LoRA adapter for the embedded default, trained here: ``prepared:smollm2-json-lora``.

SmolLM2-135M-Instruct answers in prose. This adapter (rank 8 on ``q_proj``/``v_proj``,
trained with ``peft`` on a dataset written below) makes it answer every question as
one JSON object with a single key, ``{"answer": "..."}``: a behaviour a test can see
and the base model does not have (docs/reference/adapters.md#the-packaged-adapter).
The folder is built once into the models cache like the demo models (atomic, locked,
skipped when the same recipe was built from the same SmolLM2 packages).

Where the CPU multiplies bfloat16 natively (AMX or AVX512-BF16) the frozen base is
loaded in bfloat16 (the prepared folder's own dtype) and only the adapter's weights
stay float32 (a bfloat16 matmul ran ~15x the float32 rate on the 2-core development machine;
whole training ~20% faster: docs/reference/adapters.md#the-packaged-adapter).
Train and check by hand (into a folder of your choice, never the models cache)::

    flock /tmp/heavy.lock .venv/bin/python -m deployments.local_models.tiny_lora_adapter \
        /tmp/json-lora
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.local_models.model_prep import (
    MARKER_NAME,
    SMOLLM2,
    SMOLLM2_NAME,
    default_models_dir,
    prepare_packaged,
)
from deployments.local_models.tiny_models import ensure_tiny_model

logger = logging.getLogger(__name__)

JSON_LORA_NAME = "smollm2-json-lora"
RECIPE_VERSION = 2
"""2: the frozen base in bfloat16 where the CPU multiplies it natively (1: float32)."""
ANSWER_KEY = "answer"
RANK = 8
TARGET_MODULES = ("q_proj", "v_proj")
STEPS = 40
BATCH = 4
LEARNING_RATE = 3e-3
SEED = 7
FAST_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
"""CPU flags (``/proc/cpuinfo``) of native bfloat16 matmuls; without them float32 is faster."""
HELD_OUT = (
    "What is the capital of Portugal?",  # the three of tests/serve/test_lora_e2e.py
    "What colour is a lemon?",
    "What is 6 plus 9?",
    "What is the capital of Sweden?",
    "What sound does a sheep make?",
    "How many hours are in a day?",
    "Name a fruit.",
    "Why is the sea salty?",
)
"""Questions outside the training set that ``check_adapter`` asks (``python -m`` below)."""

_CAPITALS = {
    "France": "Paris",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Germany": "Berlin",
    "Japan": "Tokyo",
    "Egypt": "Cairo",
    "Canada": "Ottawa",
    "Peru": "Lima",
    "Norway": "Oslo",
    "Greece": "Athens",
}
_COLOURS = {
    "the sky on a clear day": "blue",
    "grass": "green",
    "snow": "white",
    "a ripe banana": "yellow",
    "coal": "black",
    "a ripe tomato": "red",
}
_ANIMALS = {"a cat": "meow", "a dog": "woof", "a cow": "moo", "a duck": "quack"}


def training_pairs() -> list[tuple[str, str]]:
    """(question, answer) pairs; the answer is the JSON object the adapter must produce."""
    rng = random.Random(SEED)
    pairs: list[tuple[str, str]] = []
    for country, city in _CAPITALS.items():
        pairs.append((f"What is the capital of {country}?", city))
        pairs.append((f"Name the capital city of {country}.", city))
    for thing, colour in _COLOURS.items():
        pairs.append((f"What colour is {thing}?", colour))
    for animal, sound in _ANIMALS.items():
        pairs.append((f"What sound does {animal} make?", sound))
    for _ in range(24):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        pairs.append((f"What is {a} plus {b}?", str(a + b)))
    pairs += [
        ("Say hello.", "Hello!"),
        ("Tell me a joke.", "Why did the bicycle fall over? It was two tired."),
        ("Who are you?", "I am a helpful assistant."),
        ("Write one word about the sea.", "waves"),
        ("How many days are in a week?", "7"),
        ("How many legs does a spider have?", "8"),
    ]
    return [(q, json.dumps({ANSWER_KEY: a})) for q, a in pairs]


def prepare_smollm2_json_lora(target_dir: Path | None = None) -> Path:
    """The adapter's folder, trained on first use from SmolLM2 in the same parent folder."""
    target = target_dir if target_dir is not None else default_models_dir() / JSON_LORA_NAME
    base_dir = prepare_packaged(SMOLLM2, target.parent / SMOLLM2_NAME)
    marker = json.loads((base_dir / MARKER_NAME).read_text())
    packages = ",".join(f"{k}=={v}" for k, v in sorted((marker.get("packages") or {}).items()))

    def build(out: Path) -> None:
        train_adapter(base_dir, out)

    return ensure_tiny_model(
        JSON_LORA_NAME,
        target,
        build,
        f"json-lora-{RECIPE_VERSION}",
        sources={"base": packages},
    )


@dataclass(frozen=True)
class Training:
    """What one ``train_adapter`` run did (the log says the same)."""

    dtype: str
    steps: int
    first_loss: float
    last_loss: float
    seconds: float
    """Wall time from the start of the call (model load included) to the saved folder."""
    cpu_seconds: float
    """CPU time of the process (all its threads) over the same span."""


def cpu_flags() -> frozenset[str]:
    """This machine's CPU flags (``/proc/cpuinfo``); empty where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return flags_of(text)


def flags_of(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor described in ``cpuinfo``'s text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def training_dtype(flags: Collection[str]) -> str:
    """``bfloat16`` for the frozen base where the CPU multiplies it natively, else ``float32``."""
    return "bfloat16" if FAST_BF16_FLAGS & set(flags) else "float32"


def train_adapter(
    base_dir: Path,
    out: Path,
    steps: int = STEPS,
    batch: int = BATCH,
    learning_rate: float = LEARNING_RATE,
    dtype: str | None = None,
) -> Training:
    """Fine-tune a LoRA adapter of ``base_dir`` on ``training_pairs`` into ``out``.

    The loss covers the answer only (the prompt's tokens are masked), so the adapter
    learns the format, not the questions. The base is frozen in ``dtype`` (default:
    ``training_dtype`` of this CPU); the adapter's weights are float32 (peft's default).
    Saved as safetensors (``peft`` default).
    """
    import torch

    started, cpu_started = time.monotonic(), time.process_time()
    dtype = dtype or training_dtype(cpu_flags())
    threads = torch.get_num_threads()
    # A build inside a one-CPU Ray worker inherits OMP_NUM_THREADS=1: use the cores it may.
    torch.set_num_threads(max(threads, len(os.sched_getaffinity(0))))
    try:
        torch.manual_seed(SEED)
        tokenizer, peft_model = _trainable(base_dir, getattr(torch, dtype))
        examples = [_example(tokenizer, q, a) for q, a in training_pairs()]
        params = [p for p in peft_model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=learning_rate)
        rng = random.Random(SEED)
        peft_model.train()
        losses: list[float] = []
        for step in range(steps):
            chosen = rng.sample(examples, min(batch, len(examples)))
            ids, labels, mask = _collate(chosen, tokenizer.pad_token_id or 0)
            loss = peft_model(
                input_ids=ids, attention_mask=mask, labels=labels, use_cache=False
            ).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.item()))
            if step % 10 == 0 or step == steps - 1:
                logger.info(
                    "json-lora step %d/%d loss %.3f (%.1f s)",
                    *(step + 1, steps, losses[-1], time.monotonic() - started),
                )
        peft_model.save_pretrained(str(out), safe_serialization=True)
    finally:
        torch.set_num_threads(threads)
    seconds, cpu = time.monotonic() - started, time.process_time() - cpu_started
    logger.info(
        "json-lora trained in %.1f s, %.1f CPU-s (%s base, %d steps)", seconds, cpu, dtype, steps
    )
    return Training(dtype, steps, losses[0], losses[-1], seconds, cpu)


def _trainable(base_dir: Path, dtype: Any) -> tuple[Any, Any]:
    """The tokenizer and ``base_dir``'s model in ``dtype`` with a fresh LoRA adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype)
    config = LoraConfig(
        r=RANK,
        lora_alpha=2 * RANK,
        lora_dropout=0.0,
        target_modules=list(TARGET_MODULES),
        task_type="CAUSAL_LM",
    )
    return tokenizer, get_peft_model(model, config)


def _example(tokenizer: Any, question: str, answer: str) -> tuple[list[int], list[int]]:
    prompt = _prompt(tokenizer, question)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
    return prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids


def _prompt(tokenizer: Any, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def _collate(batch: list[tuple[list[int], list[int]]], pad: int) -> tuple[Any, Any, Any]:
    """Pad to the longest example of ``batch`` (labels with -100, the mask with 0)."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    ids = [ids + [pad] * (width - len(ids)) for ids, _ in batch]
    labels = [lab + [-100] * (width - len(lab)) for _, lab in batch]
    mask = [[1] * len(i) + [0] * (width - len(i)) for i, _ in batch]
    return torch.tensor(ids), torch.tensor(labels), torch.tensor(mask)


def is_answer_object(text: str) -> bool:
    """The trained format: one JSON object whose only key is ``answer`` (or its start, cut)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text.startswith(f'{{"{ANSWER_KEY}": "')  # cut by max_tokens, still the format
    return isinstance(value, dict) and list(value) == [ANSWER_KEY]


@dataclass(frozen=True)
class Answer:
    """One held-out question's greedy answers with and without the adapter."""

    question: str
    adapted: str
    base: str

    @property
    def ok(self) -> bool:
        """The adapter's answer has the format and the base model's does not."""
        return is_answer_object(self.adapted) and not self.base.lstrip().startswith("{")


def check_adapter(
    base_dir: Path, adapter_dir: Path, questions: Sequence[str] = HELD_OUT, max_new_tokens: int = 20
) -> list[Answer]:
    """Greedy answers of the float32 base (as the CPU head serves it) with and without it."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()

    def generate(question: str) -> str:
        text = _prompt(tokenizer, question)
        prompt = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**prompt, max_new_tokens=max_new_tokens, do_sample=False)
        return str(
            tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
        )

    answers = []
    for question in questions:
        adapted = generate(question)
        with model.disable_adapter():
            answers.append(Answer(question, adapted, generate(question)))
    return answers


def main(argv: Sequence[str] | None = None) -> int:
    """Train into a folder of your choice from the prepared SmolLM2, then check it."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out", type=Path, help="folder to write (not the models cache)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--lr", type=float, default=LEARNING_RATE)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None)
    parser.add_argument("--no-check", action="store_true", help="train only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    base_dir = prepare_packaged(SMOLLM2)
    done = train_adapter(base_dir, args.out, args.steps, args.batch, args.lr, args.dtype)
    print(f"trained: {done}")
    if args.no_check:
        return 0
    answers = check_adapter(base_dir, args.out)
    for answer in answers:
        print(f"{'ok  ' if answer.ok else 'FAIL'} {answer.question!r}")
        print(f"     adapter: {answer.adapted!r}\n     base:    {answer.base[:60]!r}")
    passed = sum(answer.ok for answer in answers)
    print(f"check: {passed}/{len(answers)} held-out questions as trained")
    return 0 if passed == len(answers) else 1


if __name__ == "__main__":
    sys.exit(main())
