"""``POST /v1/detect`` (docs/reference/documents.md#detect) and ``POST /v1/parse``
(docs/reference/documents.md#parse).

Thin: the body is parsed by pydantic, everything else (catalog, image,
refusals, head call, billing) is ``DocumentService``'s.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from serve_app.protocol.documents import DetectRequest, DetectResponse, ParseRequest, ParseResponse
from serve_app.requests.deps import InferenceCaller, State
from serve_app.requests.openapi import ERROR_RESPONSES
from serve_app.routes.answers import http_response

router = APIRouter(prefix="/v1", tags=["documents"])


@router.post(
    "/detect",
    response_model=DetectResponse,
    responses=ERROR_RESPONSES,
    summary="Detect regions (tables) in an image: label, score and pixel box each",
)
async def detect(body: DetectRequest, caller: InferenceCaller, state: State) -> Response:
    return http_response(await state.documents.detect(body, caller))


@router.post(
    "/parse",
    response_model=ParseResponse,
    responses=ERROR_RESPONSES,
    summary="Read an image: text, a chart's data table, HTML tables or LaTeX, per model",
)
async def parse(body: ParseRequest, caller: InferenceCaller, state: State) -> Response:
    return http_response(await state.documents.parse(body, caller))
