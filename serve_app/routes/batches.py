"""``/v1/batches`` (docs/api.md, "Batches"). Thin: ``BatchService`` does the work."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from serve_app.protocol.batches import Batch, BatchCreateRequest, BatchList
from serve_app.protocol.errors import ErrorEnvelope
from serve_app.requests.deps import InferenceCaller, State
from serve_app.requests.openapi import ERROR_RESPONSES

_NOT_CANCELLABLE: dict[int | str, dict[str, Any]] = {
    409: {
        "model": ErrorEnvelope,
        "description": "`batch_not_cancellable`: the batch is finalizing or has ended "
        "(completed, failed, expired)",
    }
}

router = APIRouter(prefix="/v1", tags=["batches"])


@router.post(
    "/batches",
    response_model=Batch,
    responses=ERROR_RESPONSES,
    summary="Create a batch from an uploaded JSONL file; it runs within 24 h at a discount",
)
async def create_batch(body: BatchCreateRequest, caller: InferenceCaller, state: State) -> Batch:
    return await state.batches.create(body, caller)


@router.get(
    "/batches",
    response_model=BatchList,
    responses=ERROR_RESPONSES,
    summary="The organization's batches, newest first",
)
async def list_batches(
    caller: InferenceCaller,
    state: State,
    after: Annotated[str | None, Query(description="Cursor: a batch id.")] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size.")] = 20,
) -> BatchList:
    return await state.batches.list(caller, limit=limit, after=after)


@router.get(
    "/batches/{batch_id}",
    response_model=Batch,
    responses=ERROR_RESPONSES,
    summary="One batch: status, counts, output and error files",
)
async def get_batch(batch_id: str, caller: InferenceCaller, state: State) -> Batch:
    return await state.batches.get(batch_id, caller)


@router.post(
    "/batches/{batch_id}/cancel",
    response_model=Batch,
    responses={**ERROR_RESPONSES, **_NOT_CANCELLABLE},
    summary="Cancel a batch: no new line starts; finished lines are kept",
)
async def cancel_batch(batch_id: str, caller: InferenceCaller, state: State) -> Batch:
    return await state.batches.cancel(batch_id, caller)
