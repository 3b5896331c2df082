"""A scripted pooling engine for tests of the gateway's own logic (no model).

It follows ``deployments.embeddings.base``: a text's tokens are its lower-cased words
plus two special tokens; its vector is the normalised bag of its words (not the special
tokens) hashed into
``dimensions`` buckets, so texts sharing words have a higher cosine than texts that
share none, and every vector is known exactly from its text. Token-id inputs hash
the ids. Inputs over ``max_model_len`` are refused (or cut, with ``truncate``),
ids at or above ``vocab_size`` are refused, ``dimensions`` are honoured only when
``matryoshka`` lists them. Scores are the cosine of the two vectors (a bi-encoder).
``delay_s`` holds each call (timeouts), ``fail`` raises (the head's 502),
``embeds``/``scores`` false make a score-only or embed-only model.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from typing import Any

import numpy as np
import numpy.typing as npt

from deployments import registry
from deployments.embeddings.base import PoolingEngine
from serve_app.contract.embeddings import (
    VECTOR_DTYPE,
    EmbedHeadRequest,
    EmbedHeadResult,
    PoolingHeadInfo,
    ScoreHeadRequest,
    ScoreHeadResult,
)
from serve_app.contract.errors import InvalidRequestError

SPECIAL = 2


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _bucket(item: str, size: int) -> int:
    return int.from_bytes(hashlib.sha256(item.encode()).digest()[:4], "little") % size


class ScriptedPoolingEngine(PoolingEngine):
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        self.dimensions = int(self.config.get("dimensions", 64))
        self.max_model_len = int(self.config.get("max_model_len", 32))
        self.vocab_size = int(self.config.get("vocab_size", 1000))
        self.calls: list[EmbedHeadRequest | ScoreHeadRequest] = []

    async def start(self) -> PoolingHeadInfo:
        return PoolingHeadInfo(
            max_model_len=self.max_model_len,
            dimensions=self.dimensions,
            embeds=bool(self.config.get("embeds", True)),
            scores=bool(self.config.get("scores", True)),
            score_kind="bi-encoder",
        )

    async def embed(self, request: EmbedHeadRequest) -> EmbedHeadResult:
        await self._act(request)
        if request.dimensions is not None and request.dimensions not in self.config.get(
            "matryoshka", []
        ):
            raise InvalidRequestError("no Matryoshka", code="unsupported_parameter")
        items: list[list[str]] = (
            [self._tokens(t, i) for i, t in enumerate(request.texts)]
            if request.texts is not None
            else [self._ids(ids, i) for i, ids in enumerate(request.token_ids or [])]
        )
        size = request.dimensions or self.dimensions
        rows = np.stack([self.vector(tokens, size) for tokens in items])
        return EmbedHeadResult(
            vectors=rows.astype(VECTOR_DTYPE).tobytes(),
            dimensions=size,
            prompt_tokens=sum(len(t) for t in items),
        )

    async def score(self, request: ScoreHeadRequest) -> ScoreHeadResult:
        await self._act(request)
        queries = [self._tokens(q, i) for i, q in enumerate(request.queries)]
        documents = [self._tokens(d, i) for i, d in enumerate(request.documents)]
        pairs = [queries[0 if len(queries) == 1 else i] for i in range(len(documents))]
        scores = [
            float(self.vector(q, self.dimensions) @ self.vector(d, self.dimensions))
            for q, d in zip(pairs, documents, strict=True)
        ]
        tokens = sum(len(t) for t in queries) + sum(len(t) for t in documents)
        return ScoreHeadResult(scores=scores, prompt_tokens=tokens)

    def vector(self, tokens: list[str], size: int) -> npt.NDArray[np.float32]:
        row = np.zeros(size, dtype=np.float32)
        for token in tokens:
            if token not in ("[CLS]", "[SEP]"):  # counted as tokens, not as meaning
                row[_bucket(token, size)] += 1.0
        norm = float(np.linalg.norm(row))
        return row / norm if norm else row

    def _tokens(self, text: str, index: int) -> list[str]:
        tokens = ["[CLS]", *words(text), "[SEP]"]
        return self._fit(tokens, index)

    def _ids(self, ids: list[int], index: int) -> list[str]:
        for token in ids:
            if token >= self.vocab_size:
                raise InvalidRequestError(
                    f"Token id {token} is out of vocabulary.", code="invalid_value", param="input"
                )
        return self._fit([f"#{t}" for t in ids], index)

    def _fit(self, tokens: list[str], index: int) -> list[str]:
        if len(tokens) <= self.max_model_len:
            return tokens
        if self.config.get("truncate"):
            return tokens[: self.max_model_len]
        raise InvalidRequestError(
            f"Input {index} has {len(tokens)} tokens; the maximum context length is "
            f"{self.max_model_len}.",
            code="context_length_exceeded",
            param="input",
        )

    async def _act(self, request: EmbedHeadRequest | ScoreHeadRequest) -> None:
        self.calls.append(request)
        if self.config.get("delay_s"):
            await asyncio.sleep(float(self.config["delay_s"]))
        if self.config.get("fail"):
            raise RuntimeError("scripted failure")


registry.register("pooling", "scripted", lambda config, _name: ScriptedPoolingEngine(config))
