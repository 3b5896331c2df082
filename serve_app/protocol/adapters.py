"""Wire formats of ``/api/adapters`` (docs/reference/adapters.md).

Uploads are multipart (``file`` + ``name`` + ``base_model``), so there is no request
model: the route reads the form and the service checks it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class AdapterObject(BaseModel):
    """One LoRA adapter the caller's organization may use."""

    id: str = Field(description="The adapter's id (catalog adapters: 'catalog:<model>').")
    object: Literal["adapter"] = "adapter"
    name: str
    model: str = Field(description="What to put in `model` to use it: '<base_model>:<name>'.")
    base_model: str
    source: Literal["organization", "catalog"] = Field(
        description="Uploaded by the organization, or declared by the operator."
    )
    rank: int | None = None
    target_modules: list[str] | None = None
    bytes: int | None = Field(default=None, description="Size of the weights and config.")
    sha256: str | None = Field(default=None, description="Of the safetensors weights.")
    created_at: int | None = Field(default=None, description="Unix seconds.")
    description: str | None = None


class AdapterList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AdapterObject]


class AdapterDeleted(BaseModel):
    id: str
    object: Literal["adapter"] = "adapter"
    name: str
    deleted: Literal[True] = True
