"""``GET /v1/models`` (docs/reference/models.md#list-models) and ``GET /v1/models/{id}`` (the SDK's
``models.retrieve``)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from serve_app.protocol.errors import model_not_found
from serve_app.protocol.models import ModelCard, ModelList
from serve_app.requests.deps import InferenceCaller, State
from serve_app.requests.openapi import ERROR_RESPONSES

router = APIRouter(prefix="/v1", tags=["models"])


@router.get(
    "/models",
    response_model=ModelList,
    responses=ERROR_RESPONSES,
    summary="List the models the caller may use",
)
async def list_models(caller: InferenceCaller, state: State) -> JSONResponse:
    # exclude_none: absent keys stay absent, never null (docs/reference/models.md#model-card).
    listed = state.catalog.model_list(caller)
    listed.data.extend(await state.adapters.cards(caller))  # the organization's adapters
    return JSONResponse(listed.model_dump(exclude_none=True))


@router.get(
    "/models/{model_id:path}",
    response_model=ModelCard,
    responses=ERROR_RESPONSES,
    summary="One model of the list (404 where the list does not show it)",
)
async def retrieve_model(model_id: str, caller: InferenceCaller, state: State) -> JSONResponse:
    # Not in the contract's route table, but the OpenAI SDK's ``models.retrieve`` calls it;
    # it answers exactly what the list shows this caller, so it reveals nothing more.
    if not model_id.strip("/"):  # "/v1/models/": the list, as before this route existed
        return await list_models(caller, state)
    card = state.catalog.card_for(model_id, caller)
    if card is None:
        card = next((c for c in await state.adapters.cards(caller) if c.id == model_id), None)
    if card is None:
        raise model_not_found(model_id)
    return JSONResponse(card.model_dump(exclude_none=True))
