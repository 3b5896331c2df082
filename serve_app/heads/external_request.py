"""What the gateway sends an external provider, and what it counts itself
(docs/reference/common.md#external-models, docs/api.md#external-providers).

The provider bills its own invoice for whatever it is sent, and the gateway bills the
caller from what comes back, so only fields whose effect the gateway knows and relays
are forwarded: the fields it validates itself, plus a short allow-list per route. Any
other field the client sent (``service_tier``, which moves the call to a pricier tier;
``store``, which keeps the conversation at the provider; ``metadata``, ``prediction``,
``logprobs`` the answer would drop, vLLM's sampling knobs...) is left out and named in
``x-service-ignored-params``, as an own-fleet head names what its engine cannot honour.

The provider's usage report is what a call is billed from. Where it has none that can be
billed, the gateway counts for itself: the catalog carries no tokenizer for an external
model, so the count is an estimate (``estimate_text_tokens``), the same one that reserves
the rate limits before the provider answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from serve_app.contract.chat import HeadRequest, PromptSpec

CHAT_RELAYED_FIELDS = frozenset({"response_format", "logit_bias", "parallel_tool_calls"})
"""Chat fields outside the validated ones that reach the provider: each changes only the
text the provider returns, which the gateway relays, never the price of the call.
(``response_format`` got here only if the catalog says the model honours it.)"""
COMPLETION_RELAYED_FIELDS = frozenset({"logit_bias", "suffix"})
"""The same for legacy completions (``best_of`` is not one: it is billed per candidate)."""

BYTES_PER_TOKEN = 4
"""The estimate when no tokenizer counts: one token per four UTF-8 bytes, rounded up (about
right for English; it over-counts no script by much and under-counts none to zero)."""
MESSAGE_TOKEN_ESTIMATE = 4
"""Tokens a chat template adds around each message (role markers, separators)."""
IMAGE_TOKEN_ESTIMATE = 1000
"""Tokens counted per image part (its base64 is not text)."""


@dataclass
class UpstreamRequest:
    """The provider call for one head request."""

    path: str
    body: dict[str, Any]
    ignored: list[str] = field(default_factory=list)
    """Client fields left out (``x-service-ignored-params``), sorted."""


def upstream_request(request: HeadRequest, upstream_model: str) -> UpstreamRequest:
    """The provider request for a validated head request (always streamed, with usage)."""
    sampling = request.sampling
    first = request.prompts[0]
    allowed = COMPLETION_RELAYED_FIELDS if first.kind == "completion" else CHAT_RELAYED_FIELDS
    body: dict[str, Any] = {
        "model": upstream_model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": sampling.n,
        **{k: v for k, v in sampling.extra.items() if k in allowed},
    }
    ignored = sorted(k for k in sampling.extra if k not in allowed)
    for name in ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty"):
        if (value := getattr(sampling, name)) is not None:
            body[name] = value
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if request.max_tokens is not None:
        body[request.max_tokens_param] = request.max_tokens
    if first.kind == "completion":
        body["prompt"] = [p.prompt or "" for p in request.prompts]
        return UpstreamRequest("/completions", body, ignored)
    body["messages"] = first.messages or []
    if first.tools:
        body["tools"] = first.tools
        if first.tool_choice is not None:
            body["tool_choice"] = first.tool_choice
    kwargs = dict(first.chat_template_kwargs)
    # Harmony grades (docs/reference/chat.md#reasoning-effort) travel in the template for our own
    # heads; an OpenAI-compatible provider reads them as the top-level field.
    effort = kwargs.pop("reasoning_effort", None)
    if effort is not None:
        body["reasoning_effort"] = effort
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return UpstreamRequest("/chat/completions", body, ignored)


def estimate_text_tokens(size: int) -> int:
    """Tokens for ``size`` UTF-8 bytes of text (``BYTES_PER_TOKEN``), rounded up."""
    return -(-size // BYTES_PER_TOKEN)


def utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (a lone surrogate counted as its replacement)."""
    return len(text.encode("utf-8", "replace"))


def estimate_prompt_tokens(prompts: list[PromptSpec]) -> int:
    """The gateway's own count of a prompt: its text (messages, tool calls, tool
    definitions) by ``estimate_text_tokens``, plus ``MESSAGE_TOKEN_ESTIMATE`` per message
    and ``IMAGE_TOKEN_ESTIMATE`` per image. At least 1: a prompt is never free."""
    size = 0
    extra = 0
    for prompt in prompts:
        size += utf8_size(prompt.prompt or "")
        if prompt.tools:
            size += utf8_size(json.dumps(prompt.tools, ensure_ascii=False))
        for message in prompt.messages or []:
            extra += MESSAGE_TOKEN_ESTIMATE
            message_size, images = _message_size(message)
            size += message_size
            extra += images * IMAGE_TOKEN_ESTIMATE
    return max(1, estimate_text_tokens(size) + extra)


def _message_size(message: dict[str, Any]) -> tuple[int, int]:
    """UTF-8 bytes of a message's text and the number of its images."""
    size = 0
    images = 0
    content = message.get("content")
    if isinstance(content, str):
        size += utf8_size(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                images += 1
            elif isinstance(part, dict):
                size += utf8_size(str(part.get("text") or ""))
    calls = message.get("tool_calls")
    if calls:
        size += utf8_size(json.dumps(calls, ensure_ascii=False))
    return size, images
