"""The request rules of the pooling routes that need no head: input shapes and bounds.

Every mistake is a 400 naming the element (``input[2][5]``), found before a head is
called, so a bad request never occupies a model replica (docs/api.md,
"Embeddings, rerank and score").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from serve_app.protocol.errors import InvalidRequestError

MAX_TOKEN_ID = 2**31 - 1
"""Largest token id accepted (vocabularies are far smaller; the head checks its own)."""
SPECIAL_TOKENS_ESTIMATE = 2
"""Tokens a tokenizer adds around a text ([CLS] ... [SEP]): part of the reservation."""
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class PoolingInputs:
    """Exactly one of ``texts`` and ``token_ids`` is set, non-empty."""

    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None

    @property
    def count(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids or [])

    def estimated_tokens(self, context_length: int) -> int:
        """The tokens reserved against the limits before the head counts them exactly:
        token ids as given, texts at ~4 characters a token plus the special tokens,
        each at most the context window (longer inputs are refused or truncated)."""
        if self.token_ids is not None:
            return sum(min(len(ids), context_length) for ids in self.token_ids)
        return sum(
            min(math.ceil(len(text) / CHARS_PER_TOKEN) + SPECIAL_TOKENS_ESTIMATE, context_length)
            for text in self.texts or []
        )


def embedding_inputs(value: Any, max_inputs: int) -> PoolingInputs:
    """``input`` of /v1/embeddings: a string, strings, token ids, or token-id arrays."""
    if isinstance(value, str):
        _non_empty_text(value, "input")
        return PoolingInputs(texts=[value])
    if not isinstance(value, list):
        raise _invalid(
            "input",
            "must be a string, an array of strings, an array of token ids "
            "or an array of token-id arrays",
        )
    if not value:
        raise _invalid("input", "must not be empty")
    first = value[0]
    if isinstance(first, list):
        _bounded(len(value), max_inputs, "input")
        return PoolingInputs(token_ids=[_tokens(v, f"input[{i}]") for i, v in enumerate(value)])
    if _is_token(first):
        return PoolingInputs(token_ids=[_tokens(value, "input")])
    _bounded(len(value), max_inputs, "input")
    for i, text in enumerate(value):
        if not isinstance(text, str):
            raise _invalid(f"input[{i}]", "must be a string like the other elements")
        _non_empty_text(text, f"input[{i}]")
    return PoolingInputs(texts=list(value))


def texts(value: str | list[str], param: str, max_inputs: int) -> list[str]:
    """A text or a non-empty list of them (rerank ``documents``, score ``text_1``/``text_2``)."""
    items = [value] if isinstance(value, str) else value
    if not items:
        raise _invalid(param, "must not be empty")
    _bounded(len(items), max_inputs, param)
    for i, text in enumerate(items):
        _non_empty_text(text, param if isinstance(value, str) else f"{param}[{i}]")
    return list(items)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tokens(value: Any, param: str) -> list[int]:
    if not isinstance(value, list):
        raise _invalid(param, "must be an array of token ids like the other elements")
    if not value:
        raise _invalid(param, "must not be an empty array of token ids")
    for j, token in enumerate(value):
        if not _is_token(token) or not 0 <= token <= MAX_TOKEN_ID:
            raise _invalid(f"{param}[{j}]", "must be a token id (an integer >= 0)")
    return value


def _non_empty_text(text: str, param: str) -> None:
    if not text:
        raise _invalid(param, "must not be an empty string")


def _bounded(count: int, max_inputs: int, param: str) -> None:
    if count > max_inputs:
        raise _invalid(param, f"holds {count} inputs; at most {max_inputs} are accepted")


def _invalid(param: str, reason: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid '{param}': {reason}.", code="invalid_value", param=param)
