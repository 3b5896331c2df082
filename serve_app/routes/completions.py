"""``POST /v1/completions`` (legacy, spec 4.2)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from serve_app.inference.translate import reject_unencodable
from serve_app.ingress.deps import InferenceCaller, State
from serve_app.ingress.openapi import ERROR_RESPONSES
from serve_app.protocol.completions import Completion, CompletionRequest

router = APIRouter(prefix="/v1", tags=["completions"])


@router.post(
    "/completions",
    response_model=Completion,
    responses={**ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}}},
    summary="Create a legacy text completion",
)
async def create_completion(body: CompletionRequest, caller: InferenceCaller, state: State) -> Any:
    reject_unencodable(body)
    return await state.text.completion(body, caller)
