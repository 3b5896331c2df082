"""Embeddings, rerank and score: resolve, check, admit, call the pooling head, answer, bill.

The order of checks is the other unit routes': catalog (404/403, 400 for a model
another route serves, naming it) -> request rules (input shapes and bounds,
``dimensions``; ``inputs.py``) -> readiness (503 ``model_warming`` while the head
wakes) -> limits (429; the reservation is the inputs' estimated tokens) -> head call
(502/503, 504 on timeout; 502 too for a reply that does not fit the request: a
wrong count, a NaN) -> one usage record of the input tokens the model counted, at the
model's ``input_per_mtok``; the reservation is settled to that count. The head
answers vectors as float32 bytes, which become the ``base64`` strings as they are,
or numbers for ``float``, each float32 in its shortest decimal form (docs/api.md,
"Embeddings, rerank and score").
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from serve_app.auth.principal import Principal
from serve_app.billing.records import UsageQuantities
from serve_app.catalog.catalog import Catalog, route_for
from serve_app.catalog.config import CatalogModel, Modality
from serve_app.contract.embeddings import (
    VECTOR_DTYPE,
    EmbedHeadRequest,
    EmbedHeadResult,
    ScoreHeadRequest,
    ScoreHeadResult,
)
from serve_app.heads.client import PoolingClient
from serve_app.inference.answers import Body
from serve_app.inference.embeddings.inputs import PoolingInputs, embedding_inputs, texts
from serve_app.inference.ids import new_request_id
from serve_app.inference.metering import Metering, RequestMeta
from serve_app.inference.readiness import HeadReadiness
from serve_app.inference.unary_service import UnaryHeadService
from serve_app.protocol.embeddings import (
    EmbeddingRequest,
    PoolingUsage,
    RerankRequest,
    RerankResponse,
    RerankResult,
    ScoreRequest,
    ScoreResponse,
)
from serve_app.protocol.errors import InvalidRequestError, UpstreamError

Pooled = TypeVar("Pooled", EmbedHeadResult, ScoreHeadResult)

MAX_INPUTS = 2048
"""Inputs of one embeddings request (and documents of a rerank, pairs of a score): OpenAI's."""


@dataclass(frozen=True)
class EmbeddingPolicy:
    """Bounds and timeouts of the pooling routes (``GatewayAppArgs.embeddings``)."""

    max_inputs: int = MAX_INPUTS
    timeout_s: float = 120.0


class EmbeddingService(UnaryHeadService):
    """Serves ``/v1/embeddings``, ``/v1/rerank`` and ``/v1/score`` for the catalog."""

    def __init__(
        self,
        catalog: Catalog,
        heads: dict[str, PoolingClient],
        readiness: HeadReadiness,
        policy: EmbeddingPolicy,
        metering: Metering | None = None,
        head_lookup: Callable[[str], PoolingClient | None] | None = None,
    ) -> None:
        super().__init__(catalog, readiness, metering)
        self.heads = heads
        self.policy = policy
        self.head_lookup = head_lookup
        """Heads not in ``heads`` (dedicated endpoints: ``DedicatedRouter.pooling_head_for``)."""

    async def embeddings(self, body: EmbeddingRequest, principal: Principal) -> Body:
        model = self._resolve(body.model, principal, "embedding", "/v1/embeddings")
        inputs = embedding_inputs(body.input, self.policy.max_inputs)
        dimensions = _dimensions(model, body.dimensions)
        client = self._client(model)
        request = EmbedHeadRequest(
            new_request_id("embd"), inputs.texts, inputs.token_ids, dimensions
        )
        result = await self._call(
            model,
            principal,
            "embeddings",
            request.request_id,
            inputs,
            lambda: client.embed(request),
            EmbedHeadResult,
            _first_answer_s(client),
            check=_vectors_check(inputs.count),
        )
        rows = np.frombuffer(result.vectors, dtype=VECTOR_DTYPE).reshape(inputs.count, -1)
        tokens = result.prompt_tokens
        if body.encoding_format == "base64":
            packed = [base64.b64encode(row.tobytes()).decode() for row in rows]
            return Body.json(_embedding_list(model.id, packed, tokens))
        return Body.json_with_vectors(_embedding_list(model.id, list(rows), tokens))

    async def rerank(self, body: RerankRequest, principal: Principal) -> Body:
        model = self._resolve(body.model, principal, "score", "/v1/rerank")
        documents = texts(body.documents, "documents", self.policy.max_inputs)
        inputs = PoolingInputs(texts=[body.query, *documents])
        result = await self._score(model, principal, "rerank", [body.query], documents, inputs)
        ranked = sorted(range(len(documents)), key=lambda i: -result.scores[i])
        top = ranked[: body.top_n] if body.top_n is not None else ranked
        response = RerankResponse(
            id=result.request_id,
            model=model.id,
            results=[
                RerankResult.model_validate(
                    {
                        "index": i,
                        "relevance_score": result.scores[i],
                        "document": {"text": documents[i]} if body.return_documents else None,
                    }
                )
                for i in top
            ],
            usage=PoolingUsage(**_usage(result.prompt_tokens)),
        )
        return Body.json(response.model_dump(exclude_none=True))

    async def score(self, body: ScoreRequest, principal: Principal) -> Body:
        model = self._resolve(body.model, principal, "score", "/v1/score")
        max_inputs = self.policy.max_inputs
        queries = texts(body.text_1, "text_1", max_inputs)
        documents = texts(body.text_2, "text_2", max_inputs)
        if len(queries) != 1 and len(queries) != len(documents):
            raise InvalidRequestError(
                f"text_1 holds {len(queries)} texts and text_2 {len(documents)}: give one "
                "text_1 (scored against every text_2) or as many as text_2 (pairwise).",
                code="invalid_value",
                param="text_1",
            )
        inputs = PoolingInputs(texts=[*queries, *documents])
        result = await self._score(model, principal, "score", queries, documents, inputs)
        response = ScoreResponse.model_validate(
            {
                "id": result.request_id,
                "created": int(time.time()),
                "model": model.id,
                "data": [{"index": i, "score": s} for i, s in enumerate(result.scores)],
                "usage": _usage(result.prompt_tokens),
            }
        )
        return Body.json(response.model_dump())

    def _client(self, model: CatalogModel) -> PoolingClient:
        """The catalog head of ``model``, or a dedicated endpoint's (``ded/<slug>``: 503
        while it cannot serve)."""
        if model.id not in self.heads and self.head_lookup is not None:
            client = self.head_lookup(model.id)
            if client is not None:
                return client
        return self._ready(self.heads, model)

    def _resolve(
        self, model_id: str, principal: Principal, output: Modality, route: str
    ) -> CatalogModel:
        """The pooling model named, if it gives ``output``; else 400 naming its route."""
        model = self.catalog.resolve(model_id, principal, "pooling")
        if output not in model.output_modalities:
            raise InvalidRequestError(
                f"The model '{model.id}' does not serve {route}; use {route_for(model)}.",
                code="model_not_supported_for_endpoint",
                param="model",
            )
        return model

    async def _score(
        self,
        model: CatalogModel,
        principal: Principal,
        endpoint: str,
        queries: list[str],
        documents: list[str],
        inputs: PoolingInputs,
    ) -> _Scored:
        client = self._client(model)
        request = ScoreHeadRequest(new_request_id(endpoint), queries, documents)
        result = await self._call(
            model,
            principal,
            endpoint,
            request.request_id,
            inputs,
            lambda: client.score(request),
            ScoreHeadResult,
            _first_answer_s(client),
            check=_scores_check(len(documents)),
        )
        return _Scored(request.request_id, result.scores, result.prompt_tokens)

    async def _call(
        self,
        model: CatalogModel,
        principal: Principal,
        endpoint: str,
        request_id: str,
        inputs: PoolingInputs,
        call: Callable[[], Awaitable[object]],
        result_type: type[Pooled],
        wake_s: float | None = None,
        check: Callable[[Pooled], None] | None = None,
    ) -> Pooled:
        """``wake_s``: a longer allowance the client asks for (a dedicated call that boots
        a replica from zero waits for that boot)."""
        meta = RequestMeta(principal, model, endpoint, request_id, 1)
        window = model.context_length or 1
        return await self._metered(
            meta,
            call,
            max(self.policy.timeout_s, wake_s or 0.0),
            result_type,
            _input_tokens,
            reserve_tokens=inputs.estimated_tokens(window),
            check=check,
        )


@dataclass(frozen=True)
class _Scored:
    request_id: str
    scores: list[float]
    prompt_tokens: int


def _vectors_check(count: int) -> Callable[[EmbedHeadResult], None]:
    """A head's vectors must be ``count`` rows of finite float32 (``dumps_vectors`` would
    write a NaN as ``null``); anything else is the head's fault: 502, not billed."""

    def check(result: EmbedHeadResult) -> None:
        if result.dimensions * count * 4 != len(result.vectors):
            raise UpstreamError("The model's head answered vectors that do not match the inputs.")
        if not np.isfinite(np.frombuffer(result.vectors, dtype=VECTOR_DTYPE)).all():
            raise UpstreamError("The model answered a vector that is not finite (NaN or infinity).")

    return check


def _scores_check(count: int) -> Callable[[ScoreHeadResult], None]:
    """One finite score per document, or the head's fault: 502, not billed."""

    def check(result: ScoreHeadResult) -> None:
        if len(result.scores) != count or not all(math.isfinite(s) for s in result.scores):
            raise UpstreamError("The model's head did not answer one finite score per document.")

    return check


def _first_answer_s(client: PoolingClient) -> float | None:
    wait = getattr(client, "first_event_s", None)
    return wait if isinstance(wait, int | float) else None


def _input_tokens(result: EmbedHeadResult | ScoreHeadResult) -> UsageQuantities:
    """Pooling routes bill the input tokens the model counted (nothing is generated)."""
    return UsageQuantities(prompt_tokens=result.prompt_tokens)


def _embedding_list(model_id: str, vectors: list[Any], prompt_tokens: int) -> dict[str, Any]:
    """OpenAI's answer; ``vectors`` in input order (strings, lists or float32 arrays)."""
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model_id, "usage": _usage(prompt_tokens)}


def _usage(prompt_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}


def _dimensions(model: CatalogModel, requested: int | None) -> int | None:
    """What the head is asked for: None for the model's own length (also when asked for
    exactly that), a Matryoshka length it was trained for, else 400."""
    spec = model.pooling
    full = spec.dimensions if spec is not None else None
    if requested is None or requested == full:
        return None
    allowed = (spec.matryoshka_dimensions if spec is not None else None) or []
    if requested in allowed:
        return requested
    if not allowed:
        raise InvalidRequestError(
            f"The model '{model.id}' gives {full}-dimension vectors and cannot shorten them "
            "(it is not a Matryoshka model); omit dimensions.",
            code="unsupported_parameter",
            param="dimensions",
        )
    raise InvalidRequestError(
        f"The model '{model.id}' gives {full}-dimension vectors, or one of "
        f"{', '.join(map(str, allowed))}; dimensions {requested} is not one of them.",
        code="invalid_value",
        param="dimensions",
    )
