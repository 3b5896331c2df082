"""``POST /v1/responses`` (docs/reference/responses.md#request)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from serve_app.protocol.responses import ResponseResource, ResponsesRequest
from serve_app.requests.deps import InferenceCaller, State
from serve_app.requests.openapi import ERROR_RESPONSES
from serve_app.routes.answers import http_response

router = APIRouter(prefix="/v1", tags=["responses"])


@router.post(
    "/responses",
    response_model=ResponseResource,
    responses={**ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}}},
    summary="Create a response (stateless; JSON, or named server-sent events with stream=true)",
)
async def create_response(
    body: ResponsesRequest, caller: InferenceCaller, state: State
) -> Response:
    return http_response(await state.responses.create(body, caller))
