"""``POST /v1/chat/completions`` (docs/reference/chat.md#chat-request)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from serve_app.protocol.chat import ChatCompletion, ChatCompletionRequest
from serve_app.requests.deps import InferenceCaller, State
from serve_app.requests.openapi import ERROR_RESPONSES
from serve_app.routes.answers import http_response

router = APIRouter(prefix="/v1", tags=["chat"])


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    responses={**ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}}},
    summary="Create a chat completion (JSON, or server-sent events with stream=true)",
)
async def create_chat_completion(
    body: ChatCompletionRequest, caller: InferenceCaller, state: State
) -> Response:
    # The text service, or the gateway's own tool loop (docs/reference/chat.md#server-tools).
    return http_response(await state.tool_chat.answer(body, caller))
