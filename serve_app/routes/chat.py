"""``POST /v1/chat/completions`` (spec 4.1)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from serve_app.inference.tool_chat import declares_server_tools
from serve_app.inference.translate import reject_unencodable
from serve_app.ingress.deps import InferenceCaller, State
from serve_app.ingress.openapi import ERROR_RESPONSES
from serve_app.protocol.chat import ChatCompletion, ChatCompletionRequest

router = APIRouter(prefix="/v1", tags=["chat"])


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    responses={**ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}}},
    summary="Create a chat completion (JSON, or server-sent events with stream=true)",
)
async def create_chat_completion(
    body: ChatCompletionRequest, caller: InferenceCaller, state: State
) -> Any:
    reject_unencodable(body)
    if declares_server_tools(body):  # the gateway's own tool loop (spec 4.1 rules 5-9)
        return await state.tool_chat.chat(body, caller)
    return await state.text.chat(body, caller)
