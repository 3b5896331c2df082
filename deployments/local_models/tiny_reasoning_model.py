"""A tiny Qwen3-architecture reasoning chat model, built locally for the CPU default.

No package ships a small model that deliberates on a separate channel (docs/models.md: only
a 7B R1 distill, too slow here), yet ``reasoning_content``, ``reasoning_tokens`` and the
Responses ``reasoning`` items must come from vLLM's real reasoning parser on a real
engine. So a ``Qwen3ForCausalLM`` is assembled once, served with vLLM's ``qwen3``
parser:

* architecture: Qwen3's (``model_type: qwen3``, q/k norms, GQA, tied embeddings) at toy
  size: 2 layers, hidden 128, 4 attention heads of 32 (the smallest head size vLLM's CPU
  attention takes), 2 KV heads, intermediate 256; Qwen3's full 151,936-entry vocabulary.
  Weights are seeded random: **its output is random tokens**, hence tier demo and the
  catalog's notice;
* tokenizer: Qwen3's, rebuilt from the prepared Qwen2.5-Coder folder. Qwen3's vocabulary
  is Qwen2.5's plus ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>``
  at ids 151665-151668, where Qwen2.5's file has padding entries; those four are put in
  their place (not special, as in Qwen3: decoding keeps them, so the parser sees them);
* chat template: Qwen3's own (``enable_thinking`` in ``chat_template_kwargs``: false
  writes an empty ``<think>\\n\\n</think>`` block into the prompt).

Why the ``qwen3`` parser and not ``deepseek_r1`` (both split ``<think>`` tags, vLLM
0.32): a random model never writes ``</think>``, and ``qwen3`` starts every answer in
its reasoning state unless ``enable_thinking`` is false, so the whole output is
reasoning, counted as ``reasoning_tokens``; with thinking off it is all content.
``deepseek_r1`` also calls an unclosed answer reasoning, but it counts only tokens
between a ``<think>`` and a ``</think>`` *in the output* (0 here), and it ignores
``enable_thinking`` (an answer with thinking off would still be called reasoning).

``prepared:qwen3-tiny`` names it in an engine config; ``prepared_models`` routes that name
here. The build goes through the shared tiny-model path
(``tiny_models.ensure_tiny_model``: atomic, locked, marker with the recipe version and
the Qwen2.5-Coder packages the tokenizer came from; a change in either rebuilds).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from deployments.local_models.model_prep import (
    MARKER_NAME,
    QWEN_CODER_15,
    default_models_dir,
    prepare_packaged,
    save_tokenizer,
)
from deployments.local_models.tiny_models import ensure_tiny_model

logger = logging.getLogger(__name__)

QWEN3_TINY_NAME = "qwen3-tiny"
RECIPE_VERSION = "1"
"""Bump whenever the build below changes: finished folders of an older recipe are rebuilt."""

QWEN3_ADDED_TOKENS = {
    151665: "<tool_response>",
    151666: "</tool_response>",
    151667: "<think>",
    151668: "</think>",
}
"""Qwen3's tokens beyond Qwen2.5's, at Qwen3's ids (Qwen2.5 pads those ids)."""
THINK_START_ID, THINK_END_ID = 151667, 151668

ARCHITECTURE: dict[str, Any] = {
    "vocab_size": 151_936,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    "tie_word_embeddings": True,
    "bos_token_id": 151643,  # <|endoftext|>, as in Qwen3
    "eos_token_id": 151645,  # <|im_end|>
    "pad_token_id": 151643,
}
"""Qwen3ForCausalLM's config at toy size (Qwen3-0.6B: 28 layers, hidden 1024)."""
_SEED = 0
_STEPS = 3

CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501 (the template as Qwen3 publishes it)
"""Qwen3's chat template (Qwen3-8B's, Apache-2.0), string-content variant: thinking is
on unless ``enable_thinking`` is false, which closes an empty think block in the prompt."""


def prepare_qwen3_tiny(target_dir: Path | None = None) -> Path:
    """The tiny reasoning model's folder, built on first use.

    ``target_dir`` defaults to ``<models_dir>/qwen3-tiny``; its tokenizer is taken from
    Qwen2.5-Coder prepared (or found) in the same parent folder.
    """
    target = target_dir if target_dir is not None else default_models_dir() / QWEN3_TINY_NAME
    source_dir = prepare_packaged(QWEN_CODER_15, target.parent / QWEN_CODER_15.name)
    return ensure_tiny_model(
        QWEN3_TINY_NAME,
        target,
        lambda out: _build(out, source_dir),
        RECIPE_VERSION,
        sources={"tokenizer_from": _source_of(source_dir)},
    )


def _source_of(source_dir: Path) -> str:
    """The packages (and versions) the Qwen2.5-Coder folder was prepared from."""
    marker = json.loads((source_dir / MARKER_NAME).read_text())
    packages = marker.get("packages") or {}
    return ",".join(f"{name}=={version}" for name, version in sorted(packages.items()))


def write_qwen3_tokenizer(qwen25_dir: Path, out: Path) -> None:
    """Write Qwen3's tokenizer files into ``out`` from a Qwen2.5 tokenizer folder.

    Only ``tokenizer.json`` changes: each padding entry at 151665-151668 becomes the
    Qwen3 token of that id, in the vocabulary and as an added (non-special) token.
    """
    out.mkdir(parents=True, exist_ok=True)
    config = (qwen25_dir / "tokenizer_config.json").read_text()
    (out / "tokenizer_config.json").write_text(config)
    spec = json.loads((qwen25_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = spec["model"]["vocab"]
    for token_id, token in QWEN3_ADDED_TOKENS.items():
        if vocab.pop(f"[PAD{token_id}]", None) != token_id:
            raise RuntimeError(f"{qwen25_dir}: id {token_id} is not a Qwen2.5 padding entry")
        vocab[token] = token_id
        spec["added_tokens"].append(
            {
                "id": token_id,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": False,
            }
        )
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))


def _build(out: Path, qwen25_dir: Path) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    step = time.monotonic()
    logger.info("[1/%d] Qwen3 tokenizer from %s, Qwen3 chat template", _STEPS, qwen25_dir)
    write_qwen3_tokenizer(qwen25_dir, out)
    tokenizer: Any = AutoTokenizer.from_pretrained(out, local_files_only=True)
    ids = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    if ids != [THINK_START_ID, THINK_END_ID]:
        raise RuntimeError(f"<think>/</think> became ids {ids}, not Qwen3's")
    tokenizer.chat_template = CHAT_TEMPLATE
    save_tokenizer(tokenizer, out)
    logger.info("[1/%d] done in %.1f s", _STEPS, time.monotonic() - step)

    step = time.monotonic()
    logger.info("[2/%d] Qwen3ForCausalLM with seeded random weights (2 layers, 128 wide)", _STEPS)
    torch.manual_seed(_SEED)
    config = Qwen3Config(**ARCHITECTURE)
    model: Any = Qwen3ForCausalLM(config)
    model.to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = [151645, 151643]  # <|im_end|>, <|endoftext|>
    logger.info("[2/%d] done in %.1f s", _STEPS, time.monotonic() - step)

    step = time.monotonic()
    logger.info("[3/%d] writing weights and config to %s", _STEPS, out)
    model.save_pretrained(out, safe_serialization=True)
    logger.info("[3/%d] done in %.1f s", _STEPS, time.monotonic() - step)
