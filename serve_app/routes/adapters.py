"""``/api/adapters`` (docs/reference/adapters.md). Thin: ``AdapterService`` does the work.

Uploads are multipart: the body-limit middleware counts them as they stream against
the largest adapter bound of any head plus multipart framing, and the service checks
the archive against the named base model's own bound.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile

from serve_app.adapters.service import AdapterService
from serve_app.contract.adapters import NAME_PATTERN
from serve_app.protocol.adapters import AdapterDeleted, AdapterList, AdapterObject
from serve_app.requests.deps import InferenceCaller, State, UploadingCaller
from serve_app.requests.openapi import ERROR_RESPONSES

ADAPTERS_PATH = "/api/adapters"
STREAMED_PATHS = (ADAPTERS_PATH,)
MULTIPART_OVERHEAD_BYTES = 1024 * 1024

router = APIRouter(prefix="/api", tags=["adapters"])


def body_limits(service: AdapterService) -> dict[str, int]:
    """The upload's body limit: the largest adapter bound plus multipart framing."""
    return {ADAPTERS_PATH: service.max_upload_bytes() + MULTIPART_OVERHEAD_BYTES}


@router.post(
    "/adapters",
    response_model=AdapterObject,
    responses=ERROR_RESPONSES,
    summary="Upload a PEFT LoRA adapter (zip or tar; organization admins)",
)
async def upload_adapter(
    caller: UploadingCaller,
    state: State,
    file: Annotated[
        UploadFile,
        File(description="zip or tar of adapter_config.json + adapter_model.safetensors."),
    ],
    name: Annotated[
        str,
        Form(
            pattern=NAME_PATTERN.pattern,
            description="Unique in the organization; used as <base>:<name> ('spot' reserved).",
        ),
    ],
    base_model: Annotated[str, Form(min_length=1, description="The catalog chat model it adapts.")],
) -> AdapterObject:
    return await state.adapters.upload(file, name, base_model, caller)


@router.get(
    "/adapters",
    response_model=AdapterList,
    responses=ERROR_RESPONSES,
    summary="The organization's adapters and the catalog's",
)
async def list_adapters(caller: InferenceCaller, state: State) -> AdapterList:
    return await state.adapters.list_all(caller)


@router.get(
    "/adapters/{name}",
    response_model=AdapterObject,
    responses=ERROR_RESPONSES,
    summary="One adapter",
)
async def get_adapter(name: str, caller: InferenceCaller, state: State) -> AdapterObject:
    return await state.adapters.get(name, caller)


@router.delete(
    "/adapters/{name}",
    response_model=AdapterDeleted,
    responses=ERROR_RESPONSES,
    summary="Delete an adapter (organization admins); its heads unload it",
)
async def delete_adapter(name: str, caller: InferenceCaller, state: State) -> AdapterDeleted:
    return await state.adapters.delete(name, caller)
