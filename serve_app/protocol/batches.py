"""Wire formats of ``/v1/batches`` (docs/api.md, "Batches"): OpenAI's Batch object.

Input lines are ``{custom_id, method, url, body}``; output lines
``{id, custom_id, response: {status_code, request_id, body}, error}``. The
request body of ``POST /v1/batches`` is closed (an unknown field is a 400
``unknown_parameter``): a batch runs for a day, and a setting it silently
dropped would be noticed only then.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
BatchEndpointUrl = Literal[
    "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"
]
"""Endpoints a batch may target; each has its entry in ``serve_app.batches.endpoints``
(a unit test holds the two equal)."""
CompletionWindow = Literal["24h"]
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


class BatchCreateRequest(BaseModel):
    """Request body of ``POST /v1/batches``."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: Annotated[str, Field(strict=True, min_length=1, max_length=256)]
    endpoint: BatchEndpointUrl
    completion_window: CompletionWindow
    metadata: (
        dict[str, Annotated[str, Field(strict=True, max_length=MAX_METADATA_VALUE)]] | None
    ) = Field(default=None, max_length=MAX_METADATA_PAIRS)


class BatchError(BaseModel):
    """One validation error of a batch's input file."""

    code: str
    message: str
    param: str | None = None
    line: int | None = Field(default=None, description="1-based line of the input file.")


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchRequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class Batch(BaseModel):
    """OpenAI's Batch object."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts
    metadata: dict[str, str] | None = None


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class BatchLineResponse(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class BatchLineError(BaseModel):
    code: str
    message: str


class BatchOutputLine(BaseModel):
    """One line of a batch's output or error file."""

    id: str
    custom_id: str
    response: BatchLineResponse | None = None
    error: BatchLineError | None = None
