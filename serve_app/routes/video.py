"""Video generation jobs (docs/reference/video.md) and the local object store's signed file URLs.

Thin: bodies are parsed by pydantic, everything else is ``VideoService``'s.
``GET /v1/video/files/{key}`` takes no API key: the URL's expiring HMAC
signature is its credential, as a presigned S3 URL's is (it is what
``video.url`` points at with the embedded local store).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

from serve_app.protocol.video import (
    VideoGenerationDeleted,
    VideoGenerationJob,
    VideoGenerationJobList,
    VideoGenerationRequest,
)
from serve_app.requests.deps import InferenceCaller, State
from serve_app.requests.openapi import ERROR_RESPONSES
from serve_app.routes.answers import http_response

router = APIRouter(prefix="/v1/video", tags=["video"])


@router.post(
    "/generations",
    status_code=202,
    response_model=VideoGenerationJob,
    responses=ERROR_RESPONSES,
    summary="Queue a text-to-video job; poll it until completed",
)
async def create_job(
    body: VideoGenerationRequest, caller: InferenceCaller, state: State, request: Request
) -> Response:
    return http_response(await state.video.create(body, caller, str(request.base_url)))


@router.get(
    "/generations",
    response_model=VideoGenerationJobList,
    responses=ERROR_RESPONSES,
    summary="The caller's 20 most recent video jobs, newest first",
)
async def list_jobs(caller: InferenceCaller, state: State, request: Request) -> Response:
    return http_response(await state.video.list_recent(caller, str(request.base_url)))


@router.get(
    "/generations/{job_id}",
    response_model=VideoGenerationJob,
    responses=ERROR_RESPONSES,
    summary="One video job, reconciled, with a fresh video URL when completed",
)
async def get_job(job_id: str, caller: InferenceCaller, state: State, request: Request) -> Response:
    return http_response(await state.video.get(job_id, caller, str(request.base_url)))


@router.post(
    "/generations/{job_id}/cancel",
    response_model=VideoGenerationJob,
    responses=ERROR_RESPONSES,
    summary="Cancel a queued or running video job (best effort); returns the job",
)
async def cancel_job(
    job_id: str, caller: InferenceCaller, state: State, request: Request
) -> Response:
    return http_response(await state.video.cancel(job_id, caller, str(request.base_url)))


@router.delete(
    "/generations/{job_id}",
    response_model=VideoGenerationDeleted,
    responses=ERROR_RESPONSES,
    summary="Delete a video job and its file (frees the organization's storage)",
)
async def delete_job(job_id: str, caller: InferenceCaller, state: State) -> Response:
    return http_response(await state.video.delete(job_id, caller))


@router.get(
    "/files/{key:path}",
    responses=ERROR_RESPONSES,
    response_class=FileResponse,
    summary="A generated video behind a signed, expiring URL (local object store)",
)
async def get_file(key: str, expires: str, signature: str, state: State) -> FileResponse:
    path = state.video.local_file(key, expires, signature)
    return FileResponse(path, media_type="video/mp4")
