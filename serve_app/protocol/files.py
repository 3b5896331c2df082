"""Wire formats of ``/v1/files`` (docs/api.md, "Files"): OpenAI's File object and lists.

Uploads are multipart (``file`` + ``purpose``), so there is no request model: the
route reads the form and the service checks it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

UPLOAD_PURPOSES = ("batch",)
"""Purposes a client may upload; ``batch_output`` files are written by batches only."""
FilePurpose = Literal["batch", "batch_output"]


class FileObject(BaseModel):
    """OpenAI's File object."""

    id: str
    object: Literal["file"] = "file"
    bytes: int = Field(description="Size of the file in bytes.")
    created_at: int = Field(description="Unix seconds.")
    filename: str
    purpose: FilePurpose
    status: Literal["processed"] = Field(
        default="processed", description="Deprecated by OpenAI; always processed here."
    )
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    """A page of files, newest first (``after`` pages on)."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    """The answer of ``DELETE /v1/files/{id}``."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
