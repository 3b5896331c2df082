"""Wire formats of ``POST /v1/detect`` and ``POST /v1/parse`` (docs/reference/documents.md).

The result fields are fixed here and documented in
``docs/reference/documents.md``: detect answers ``{id, object, model, regions: [{label, score,
box: [x0, y0, x1, y1]}], usage: {images}}`` with pixel boxes of the image as
sent; parse answers ``{id, object, model, <field>, usage: {images}}`` where
``<field>`` is exactly one of ``text``, ``table``, ``tables`` or ``output``,
fixed per model. Unknown request fields are accepted and named in
``x-service-ignored-params``. ``stream`` and ``max_new_tokens`` are strict (no
string or boolean coercion), as the video route's integers are: a request never
runs with a value the caller did not write.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from serve_app.protocol.common import WholeInt

BoxField = Annotated[list[float], Field(min_length=4, max_length=4)]
MAX_TABLE_BBOXES = 64


class _DocumentRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, description="A detect (or parse) model of the catalog.")
    image: str = Field(
        min_length=1, description="Base64 image bytes, or a data:image/...;base64,... URI."
    )
    stream: bool | None = Field(
        default=None, strict=True, description="Not supported: true gives 400."
    )

    def extra_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


class DetectRequest(_DocumentRequest):
    """Request body of ``POST /v1/detect``."""


class ParseRequest(_DocumentRequest):
    """Request body of ``POST /v1/parse``."""

    max_new_tokens: WholeInt | None = Field(
        default=None,
        ge=1,
        description="Generation bound (a JSON integer); clamped to the model's bound.",
    )
    table_bboxes: list[BoxField] | None = Field(
        default=None,
        max_length=MAX_TABLE_BBOXES,
        description="Pixel boxes [x0, y0, x1, y1] of tables inside the image (0 <= x0 < x1 "
        "<= width, 0 <= y0 < y1 <= height); required by table-structure models "
        "(tableformer), ignored by the others.",
    )


class ImageUsage(BaseModel):
    images: int = Field(description="Images processed (billed per image).")


class DetectedRegion(BaseModel):
    label: str = Field(description="Region class, e.g. 'table'.")
    score: float = Field(description="Confidence in [0, 1].")
    box: list[float] = Field(description="Pixel box [x0, y0, x1, y1] of the image as sent.")


class DetectResponse(BaseModel):
    """200 body of ``POST /v1/detect``."""

    id: str
    object: Literal["detection"] = "detection"
    model: str
    regions: list[DetectedRegion]
    usage: ImageUsage


class ParseResponse(BaseModel):
    """200 body of ``POST /v1/parse``: exactly one of text, table, tables, output is set."""

    model_config = ConfigDict(extra="forbid")

    id: str
    object: Literal["parse"] = "parse"
    model: str
    text: str | None = Field(default=None, description="trocr, got-ocr-2: the text read.")
    table: str | None = Field(default=None, description="deplot: the linearized data table.")
    tables: list[str] | None = Field(
        default=None, description="tableformer: one HTML table per table_bboxes entry."
    )
    output: str | None = Field(default=None, description="pix2text: the LaTeX of the formula.")
    usage: ImageUsage
