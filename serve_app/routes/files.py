"""``/v1/files`` (docs/api.md, "Files"). Thin: ``FileService`` does the work.

Uploads are multipart: the body-limit middleware counts them as they stream
against the file limit plus multipart framing, Starlette spools the file to a
temporary file, and the service checks its exact size and copies it to the object
store in chunks. A download is streamed from the store (a ``FrameStream``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, Response, UploadFile

from serve_app.files.service import FileService
from serve_app.protocol.files import FileDeleted, FileList, FileObject
from serve_app.requests.deps import InferenceCaller, State, UploadingCaller
from serve_app.requests.openapi import ERROR_RESPONSES
from serve_app.routes.answers import http_response

FILES_PATH = "/v1/files"
STREAMED_PATHS = (FILES_PATH,)
MULTIPART_OVERHEAD_BYTES = 1024 * 1024

router = APIRouter(prefix="/v1", tags=["files"])


def body_limits(service: FileService) -> dict[str, int]:
    """The upload's body limit: the file limit plus multipart framing."""
    return {FILES_PATH: service.policy.max_file_bytes + MULTIPART_OVERHEAD_BYTES}


@router.post(
    "/files",
    response_model=FileObject,
    responses=ERROR_RESPONSES,
    summary="Upload a file (purpose 'batch': a JSONL batch input file)",
)
async def upload_file(
    caller: UploadingCaller,
    state: State,
    file: Annotated[UploadFile, File(description="The file (JSONL for purpose 'batch').")],
    purpose: Annotated[Literal["batch"], Form(description="'batch' (JSONL batch input).")],
) -> FileObject:
    return await state.files.upload(file, purpose, caller)


@router.get(
    "/files",
    response_model=FileList,
    responses=ERROR_RESPONSES,
    summary="The organization's files, newest first by default",
)
async def list_files(
    caller: InferenceCaller,
    state: State,
    after: Annotated[str | None, Query(description="Cursor: a file id.")] = None,
    limit: Annotated[int | None, Query(ge=1, le=10_000, description="Page size.")] = None,
    purpose: Annotated[str | None, Query()] = None,
    order: Annotated[Literal["asc", "desc"], Query(description="By created_at.")] = "desc",
) -> FileList:
    return await state.files.list(caller, limit=limit, after=after, purpose=purpose, order=order)


@router.get(
    "/files/{file_id}",
    response_model=FileObject,
    responses=ERROR_RESPONSES,
    summary="One file's File object",
)
async def get_file(file_id: str, caller: InferenceCaller, state: State) -> FileObject:
    return await state.files.get(file_id, caller)


@router.get(
    "/files/{file_id}/content",
    response_class=Response,
    responses={**ERROR_RESPONSES, 200: {"content": {"application/jsonl": {}}}},
    summary="A file's bytes",
)
async def get_file_content(file_id: str, caller: InferenceCaller, state: State) -> Response:
    return http_response(await state.files.content(file_id, caller))


@router.delete(
    "/files/{file_id}",
    response_model=FileDeleted,
    responses=ERROR_RESPONSES,
    summary="Delete a file and its bytes",
)
async def delete_file(file_id: str, caller: InferenceCaller, state: State) -> FileDeleted:
    return await state.files.delete(file_id, caller)
