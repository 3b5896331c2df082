"""``POST /v1/responses`` (spec 4.3)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from serve_app.ingress.deps import InferenceCaller, State
from serve_app.ingress.openapi import ERROR_RESPONSES
from serve_app.protocol.responses import ResponseResource, ResponsesRequest

router = APIRouter(prefix="/v1", tags=["responses"])


@router.post(
    "/responses",
    response_model=ResponseResource,
    responses={**ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}}},
    summary="Create a response (stateless; JSON, or named server-sent events with stream=true)",
)
async def create_response(body: ResponsesRequest, caller: InferenceCaller, state: State) -> Any:
    return await state.responses.create(body, caller)
