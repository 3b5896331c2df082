"""``GET /v1/models`` (spec 4.12)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from serve_app.ingress.deps import InferenceCaller, State
from serve_app.ingress.openapi import ERROR_RESPONSES
from serve_app.protocol.models import ModelList

router = APIRouter(prefix="/v1", tags=["models"])


@router.get(
    "/models",
    response_model=ModelList,
    responses=ERROR_RESPONSES,
    summary="List the models the caller may use",
)
async def list_models(caller: InferenceCaller, state: State) -> JSONResponse:
    # exclude_none: absent keys stay absent (spec 2.2: "absent (not null)").
    return JSONResponse(state.catalog.model_list(caller).model_dump(exclude_none=True))
