"""A tiny SmolVLM-architecture vision chat model, built locally for the CPU default.

No package ships a small vision chat model and no model hub is reachable here,
yet images must travel vLLM's real multimodal path (processor, vision encoder,
image tokens in the prompt, their embeddings merged into the text model). So an
``Idefics3ForConditionalGeneration`` (SmolVLM's architecture) is assembled once:

* text model: SmolLM2-135M-Instruct's own config and weights, from the
  ``prepared:smollm2-135m-instruct`` folder (built first when missing), so the
  text of its answers is SmolLM2's;
* vision tower and connector: seeded random weights, 1 layer, 64 wide, 64x64
  images in 16-pixel patches, ``scale_factor`` 2, hence 4 image tokens per image.
  Whatever it says about an image is invented: the catalog marks it as a demo;
* tokenizer: SmolLM2's plus the four Idefics3 special tokens, embeddings resized
  to match; ``image_token_id`` is the id of ``<image>``;
* ``Idefics3Processor(image_seq_len=4)`` over an ``Idefics3ImageProcessor``
  without splitting (every image is resized to fit 64 px), and a chat template
  that keeps SmolLM2's ChatML framing (the weights answer in it and stop at
  ``<|im_end|>``) while placing image parts SmolVLM-style as ``<image>``.

``prepared:smolvlm-tiny`` names it in an engine config; ``prepared_models`` routes
that name here. Builds are atomic and locked (``model_prep.build_atomically``);
the marker records the recipe version and the SmolLM2 source it was built from,
so the model is rebuilt only when either changes. Each step is logged.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from deployments.local_models.model_prep import (
    MARKER_NAME,
    SMOLLM2_NAME,
    build_atomically,
    default_models_dir,
    exclusive,
    is_prepared,
    prepare_smollm2,
    save_tokenizer,
)

logger = logging.getLogger(__name__)

SMOLVLM_TINY_NAME = "smolvlm-tiny"
RECIPE_VERSION = "1"
"""Bump whenever the build below changes: finished folders of an older recipe are rebuilt."""

IMAGE_SIZE = 64
PATCH_SIZE = 16
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
"""Image tokens one image costs in the prompt (plus its wrapper tokens): 4."""

SPECIAL_TOKENS = ("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>")
_STEPS = 4
_SEED = 0

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- elif part['type'] in ('image', 'image_url', 'input_image') %}{{- '<image>' }}"
    "{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""SmolLM2's ChatML (its default system prompt included) with SmolVLM-style image parts."""


def prepare_smolvlm_tiny(target_dir: Path | None = None) -> Path:
    """The tiny vision model's folder, built on first use next to the SmolLM2 folder it uses.

    ``target_dir`` defaults to ``<models_dir>/smolvlm-tiny``; SmolLM2 is prepared (or
    found) in the same parent folder, so one models folder holds both.
    """
    target = target_dir if target_dir is not None else default_models_dir() / SMOLVLM_TINY_NAME
    text_dir = prepare_smollm2(target.parent / SMOLLM2_NAME)
    marker = _marker(text_dir)
    if is_prepared(target, marker):
        logger.info("%s already built (recipe %s)", target, RECIPE_VERSION)
        return target
    with exclusive(target.with_name(f".{target.name}.lock")):
        if not is_prepared(target, marker):  # another process may have finished meanwhile
            started = time.monotonic()
            logger.info("building the tiny SmolVLM demo model into %s", target)
            build_atomically(target, marker, lambda tmp: _build(tmp, text_dir))
            logger.info(
                "[%d/%d] %s built in %.1f s", _STEPS, _STEPS, target, time.monotonic() - started
            )
    return target


def _marker(text_dir: Path) -> dict[str, str]:
    """The recipe version plus the SmolLM2 build it reads: a change in either rebuilds."""
    text_marker = json.loads((text_dir / MARKER_NAME).read_text())
    source = f"{text_marker.get('package')}=={text_marker.get('version')}"
    return {"tiny": SMOLVLM_TINY_NAME, "recipe": RECIPE_VERSION, "text_model": source}


def _build(out: Path, text_dir: Path) -> None:
    """Steps 1-3: SmolLM2's tokenizer and weights, the Idefics3 model around them, the files."""
    import torch

    torch.manual_seed(_SEED)
    tokenizer, text_config, text_model = _load_text_model(text_dir)
    model = _assemble(tokenizer, text_config, text_model)
    del text_model  # the weights live on in the Idefics3 model; free the copy before writing
    _write(out, model, tokenizer)


def _load_text_model(text_dir: Path) -> tuple[Any, Any, Any]:
    """Step 1: SmolLM2's tokenizer (with the image tokens added), config and weights."""
    import torch
    from tokenizers import AddedToken
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    step = time.monotonic()
    logger.info("[1/%d] tokenizer and text model from %s", _STEPS, text_dir)
    tokenizer = AutoTokenizer.from_pretrained(text_dir, local_files_only=True)
    base_vocab = len(tokenizer)
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        special_tokens=True,
    )
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    if not isinstance(image_token_id, int) or image_token_id < base_vocab:
        raise RuntimeError(f"<image> did not become a new token (id {image_token_id})")
    text_config = AutoConfig.from_pretrained(text_dir, local_files_only=True)
    text_model: Any = AutoModelForCausalLM.from_pretrained(
        text_dir, dtype=torch.float32, local_files_only=True
    )
    text_model.resize_token_embeddings(len(tokenizer))
    text_config.vocab_size = len(tokenizer)
    logger.info(
        "[1/%d] loaded in %.1f s (vocab %d)", _STEPS, time.monotonic() - step, len(tokenizer)
    )
    return tokenizer, text_config, text_model


def _assemble(tokenizer: Any, text_config: Any, text_model: Any) -> Any:
    """Step 2: an Idefics3 model with SmolLM2's weights and a random vision tower."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3VisionConfig

    step = time.monotonic()
    logger.info("[2/%d] Idefics3 model: SmolLM2 weights, random vision tower", _STEPS)
    vision_config = Idefics3VisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
    )
    config = Idefics3Config(
        text_config=text_config.to_dict(),
        vision_config=vision_config.to_dict(),
        scale_factor=SCALE_FACTOR,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        # The top-level default (128002) is not a token here; SmolLM2 pads with <|im_end|>.
        pad_token_id=text_config.pad_token_id,
        tie_word_embeddings=text_config.tie_word_embeddings,
    )
    model: Any = Idefics3ForConditionalGeneration(config)
    model.model.text_model.load_state_dict(text_model.model.state_dict(), strict=True)
    model.lm_head.load_state_dict(text_model.lm_head.state_dict(), strict=True)
    model.to(torch.bfloat16).eval()
    logger.info("[2/%d] assembled in %.1f s", _STEPS, time.monotonic() - step)
    return model


def _write(out: Path, model: Any, tokenizer: Any) -> None:
    """Step 3: weights, processor and chat template, readable by every user."""
    from transformers import Idefics3ImageProcessor, Idefics3Processor

    step = time.monotonic()
    logger.info("[3/%d] writing weights, processor and chat template to %s", _STEPS, out)
    model.save_pretrained(out, safe_serialization=True)
    image_processor = Idefics3ImageProcessor(
        do_image_splitting=False,
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    save_tokenizer(tokenizer, out)  # the template also where older loaders look
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # replicas may run as other users
    logger.info("[3/%d] written in %.1f s", _STEPS, time.monotonic() - step)
