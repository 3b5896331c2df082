"""``POST /v1/embeddings``, ``/v1/rerank`` and ``/v1/score`` (docs/api.md, "Embeddings,
rerank and score").

Thin: the body is parsed by pydantic (closed bodies: an unknown field is 400
``unknown_parameter``); everything else is ``EmbeddingService``'s.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from serve_app.protocol.embeddings import (
    EmbeddingRequest,
    EmbeddingResponse,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)
from serve_app.requests.deps import InferenceCaller, State
from serve_app.requests.openapi import ERROR_RESPONSES
from serve_app.routes.answers import http_response

router = APIRouter(prefix="/v1", tags=["embeddings"])


@router.post(
    "/embeddings",
    response_model=EmbeddingResponse,
    responses=ERROR_RESPONSES,
    summary="Embed texts or token ids: one vector per input, in input order",
)
async def embeddings(body: EmbeddingRequest, caller: InferenceCaller, state: State) -> Response:
    return http_response(await state.embeddings.embeddings(body, caller))


@router.post(
    "/rerank",
    response_model=RerankResponse,
    responses=ERROR_RESPONSES,
    summary="Rank documents against a query, best first",
)
async def rerank(body: RerankRequest, caller: InferenceCaller, state: State) -> Response:
    return http_response(await state.embeddings.rerank(body, caller))


@router.post(
    "/score",
    response_model=ScoreResponse,
    responses=ERROR_RESPONSES,
    summary="Score text pairs (1:1, 1:N or N:N)",
)
async def score(body: ScoreRequest, caller: InferenceCaller, state: State) -> Response:
    return http_response(await state.embeddings.score(body, caller))
