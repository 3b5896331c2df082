"""What the locally built tiny random-weight models share: the folder and the tokenizer.

``tiny:<kind>`` in an engine config names ``<models_dir>/tiny-<kind>``, built on
first use (``resolve``) by one builder per kind (``tiny_document_models``,
``tiny_video_model``); ``tiny_reasoning_model`` builds ``prepared:qwen3-tiny`` the
same way. Builds are atomic and locked (``model_prep.build_atomically``) and skipped
when a finished build of the same recipe version (and of the same sources, for a
model built from another prepared one) is there, so replicas starting together
build once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from deployments.local_models.model_prep import (
    build_atomically,
    exclusive,
    is_prepared,
)

logger = logging.getLogger(__name__)

Builder = Callable[[Path], None]


def ensure_tiny_model(
    kind: str,
    target: Path,
    builder: Builder,
    recipe: str,
    sources: Mapping[str, str] | None = None,
) -> Path:
    """Build ``kind`` into ``target`` with ``builder`` unless recipe ``recipe`` is there.

    ``sources`` names what the build reads besides its recipe (e.g. a prepared model's
    package versions): recorded in the marker, so a change there rebuilds too.
    """
    marker = {"tiny": kind, "recipe": recipe, **(sources or {})}
    if is_prepared(target, marker):
        return target
    with exclusive(target.with_name(f".{target.name}.lock")):
        if not is_prepared(target, marker):
            started = time.monotonic()
            logger.info("building the tiny random-weight %s model into %s", kind, target)
            build_atomically(target, marker, builder)
            logger.info("tiny %s model ready in %.1f s", kind, time.monotonic() - started)
    return target


def bpe_tokenizer(corpus: Sequence[str], vocab_size: int, *, bos: bool) -> Any:
    """A byte-level BPE tokenizer trained on ``corpus``, wrapped for transformers.

    ``<pad>``, ``</s>`` and ``<unk>`` always, ``<s>`` with ``bos`` (encoder-decoder
    models that start generation from it).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "<s>", "</s>", "<unk>"] if bos else ["<pad>", "</s>", "<unk>"]
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator(list(corpus), trainer=trainer)
    tokens: dict[str, str] = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    if bos:
        tokens["bos_token"] = "<s>"
    return PreTrainedTokenizerFast(tokenizer_object=raw, **tokens)
