"""``POST /v1/completions`` (legacy, docs/reference/chat.md#completions)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from serve_app.inference.chat.translate import reject_unencodable
from serve_app.protocol.completions import Completion, CompletionRequest
from serve_app.requests.deps import InferenceCaller, State
from serve_app.requests.openapi import ERROR_RESPONSES
from serve_app.routes.answers import http_response

router = APIRouter(prefix="/v1", tags=["completions"])


@router.post(
    "/completions",
    response_model=Completion,
    responses={**ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}}},
    summary="Create a legacy text completion",
)
async def create_completion(
    body: CompletionRequest, caller: InferenceCaller, state: State
) -> Response:
    reject_unencodable(body)
    return http_response(await state.text.completion(body, caller))
