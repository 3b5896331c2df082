"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API
(docs/reference/messages.md). Errors under these paths use Anthropic's envelope (the one
mapper, ``serve_app.ingress.errors``, keys it by path)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from serve_app.inference.messages.service import parse_betas
from serve_app.protocol.messages import (
    CountTokensRequest,
    CountTokensResponse,
    MessageResponse,
    MessagesRequest,
)
from serve_app.requests.deps import MessagesCaller, State
from serve_app.requests.openapi import ANTHROPIC_ERROR_RESPONSES
from serve_app.routes.answers import http_response

router = APIRouter(prefix="/v1", tags=["messages"])


@router.post(
    "/messages",
    response_model=MessageResponse,
    responses={**ANTHROPIC_ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}}},
    summary="Create a message (Anthropic Messages API; JSON, or named events with stream=true)",
)
async def create_message(
    body: MessagesRequest, caller: MessagesCaller, state: State, request: Request
) -> Response:
    betas = parse_betas(request.headers.getlist("anthropic-beta"))
    return http_response(await state.messages.create(body, caller, betas))


@router.post(
    "/messages/count_tokens",
    response_model=CountTokensResponse,
    responses=ANTHROPIC_ERROR_RESPONSES,
    summary="Count a Messages request's input tokens (nothing generated, nothing billed)",
)
async def count_message_tokens(
    body: CountTokensRequest, caller: MessagesCaller, state: State, request: Request
) -> Response:
    betas = parse_betas(request.headers.getlist("anthropic-beta"))
    return http_response(await state.messages.count_tokens(body, caller, betas))
