"""``/api/dedicated``: private, autoscaled model endpoints (docs/reference/dedicated.md#routes).

Thin handlers over ``serve_app.dedicated.api.facade.Dedicated``. The paths beyond
the basic ones follow the same style (docs/reference/dedicated.md#routes):
``POST .../pause``, ``POST .../resume``, ``PUT .../engine``,
``GET .../telemetry?window=``, ``GET .../scaling-history?limit=``, ``GET .../health``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from serve_app.dedicated.api.facade import Dedicated
from serve_app.protocol.dedicated import (
    DedicatedCreateRequest,
    DedicatedEndpoint,
    DedicatedEngineChange,
    DedicatedModeChange,
    DedicatedModePreview,
    DedicatedModeTarget,
    DedicatedPatchRequest,
    DedicatedRateCard,
    DedicatedReplicaHealth,
    DedicatedScalingHistory,
    DedicatedTelemetry,
    Window,
)
from serve_app.protocol.errors import NotFoundError
from serve_app.requests.deps import DedicatedCaller, State
from serve_app.requests.openapi import ERROR_RESPONSES

router = APIRouter(prefix="/api/dedicated", tags=["dedicated endpoints"], responses=ERROR_RESPONSES)


def _dedicated(state: State) -> Dedicated:
    subsystem = getattr(state, "dedicated", None)
    if subsystem is None:
        raise NotFoundError("Dedicated endpoints are not enabled here.", code="unknown_route")
    return subsystem


Subsystem = Annotated[Dedicated, Depends(_dedicated)]


@router.get("", response_model=list[DedicatedEndpoint], summary="List your endpoints")
async def list_endpoints(caller: DedicatedCaller, ded: Subsystem) -> list[DedicatedEndpoint]:
    return await ded.list(caller)


@router.post("", response_model=DedicatedEndpoint, status_code=201, summary="Create an endpoint")
async def create_endpoint(
    body: DedicatedCreateRequest, caller: DedicatedCaller, ded: Subsystem
) -> DedicatedEndpoint:
    return await ded.create(body, caller)


@router.get("/rates", response_model=DedicatedRateCard, summary="The rate card")
async def rates(caller: DedicatedCaller, ded: Subsystem) -> DedicatedRateCard:
    return await ded.rates(caller)


@router.get("/{endpoint_id}", response_model=DedicatedEndpoint, summary="One endpoint")
async def get_endpoint(
    endpoint_id: str, caller: DedicatedCaller, ded: Subsystem
) -> DedicatedEndpoint:
    return await ded.get(endpoint_id, caller)


@router.patch(
    "/{endpoint_id}", response_model=DedicatedEndpoint, summary="Bounds and policy (live)"
)
async def patch_endpoint(
    endpoint_id: str, body: DedicatedPatchRequest, caller: DedicatedCaller, ded: Subsystem
) -> DedicatedEndpoint:
    return await ded.patch(endpoint_id, body, caller)


@router.delete("/{endpoint_id}", response_model=DedicatedEndpoint, summary="Delete an endpoint")
async def delete_endpoint(
    endpoint_id: str, caller: DedicatedCaller, ded: Subsystem
) -> DedicatedEndpoint:
    return await ded.delete(endpoint_id, caller)


@router.post(
    "/{endpoint_id}/mode/preview",
    response_model=DedicatedModePreview,
    summary="Quote a mode change",
)
async def preview_mode(
    endpoint_id: str, body: DedicatedModeTarget, caller: DedicatedCaller, ded: Subsystem
) -> DedicatedModePreview:
    return await ded.preview(endpoint_id, body, caller)


@router.put("/{endpoint_id}/mode", response_model=DedicatedEndpoint, summary="Change the mode")
async def change_mode(
    endpoint_id: str, body: DedicatedModeChange, caller: DedicatedCaller, ded: Subsystem
) -> DedicatedEndpoint:
    return await ded.change_mode(endpoint_id, body, caller)


@router.put("/{endpoint_id}/engine", response_model=DedicatedEndpoint, summary="Replace engine")
async def change_engine(
    endpoint_id: str, body: DedicatedEngineChange, caller: DedicatedCaller, ded: Subsystem
) -> DedicatedEndpoint:
    return await ded.change_engine(endpoint_id, body, caller)


@router.post("/{endpoint_id}/pause", response_model=DedicatedEndpoint, summary="Release replicas")
async def pause(endpoint_id: str, caller: DedicatedCaller, ded: Subsystem) -> DedicatedEndpoint:
    return await ded.pause(endpoint_id, caller)


@router.post("/{endpoint_id}/resume", response_model=DedicatedEndpoint, summary="Redeploy")
async def resume(endpoint_id: str, caller: DedicatedCaller, ded: Subsystem) -> DedicatedEndpoint:
    return await ded.resume(endpoint_id, caller)


@router.get("/{endpoint_id}/telemetry", response_model=DedicatedTelemetry, summary="Telemetry")
async def telemetry(
    endpoint_id: str,
    caller: DedicatedCaller,
    ded: Subsystem,
    window: Annotated[Window, Query(description="1h, 24h or 7d")] = "1h",
) -> DedicatedTelemetry:
    return await ded.telemetry(endpoint_id, window, caller)


@router.get(
    "/{endpoint_id}/scaling-history",
    response_model=DedicatedScalingHistory,
    summary="Replica lifetimes, newest first",
)
async def scaling_history(
    endpoint_id: str,
    caller: DedicatedCaller,
    ded: Subsystem,
    limit: Annotated[int | None, Query(ge=1, description="Items to return")] = None,
) -> DedicatedScalingHistory:
    return await ded.history(endpoint_id, limit, caller)


@router.get(
    "/{endpoint_id}/health", response_model=DedicatedReplicaHealth, summary="Replica health"
)
async def health(
    endpoint_id: str, caller: DedicatedCaller, ded: Subsystem
) -> DedicatedReplicaHealth:
    return await ded.health(endpoint_id, caller)
