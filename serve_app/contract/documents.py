"""Values the gateway and the detect/parse heads share, and exchange over a handle.

Plain dataclasses of builtins only, so a head can run in another process or
in-process in tests. The image crosses as the bytes the gateway decoded and
sniffed (never re-encoded); a head answers with its result or one
``HeadFailure``, never by raising, so a 400 found in the head stays a 400.
The pixel bound and its 400 are here because both sides enforce them: the
gateway on the image header, the head again before it decodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from serve_app.contract.errors import HeadFailure, InvalidRequestError

MAX_IMAGE_PIXELS = 40_000_000
"""Largest decoded image (width x height) a document head accepts: an A4 page at 600 dpi
(35 M) fits, while a few kilobytes of PNG cannot expand into gigabytes of RGB."""


def too_many_pixels(width: int | None, height: int | None, limit: int) -> InvalidRequestError:
    """The 400 for an image over the pixel bound: one wording for the gateway's check on
    the header and the head's own check before it decodes."""
    size = f"{width} x {height} pixels" if width and height else "too many pixels"
    return InvalidRequestError(
        f"Invalid image: it is {size}; at most {limit:,} pixels are accepted.",
        code="invalid_image",
        param="image",
    )


ParseField = Literal["text", "table", "tables", "output"]
"""docs/reference/documents.md#parse: a parse result carries exactly one of these, fixed per
head."""

Box = list[float]


@dataclass
class Region:
    """One detected region: its class, confidence and pixel box."""

    label: str
    score: float
    box: Box


@dataclass
class DetectHeadRequest:
    request_id: str
    image: bytes
    max_pixels: int = MAX_IMAGE_PIXELS
    """The gateway's pixel bound, enforced again where the image is decoded."""


@dataclass
class DetectHeadResult:
    regions: list[Region]


@dataclass
class ParseHeadRequest:
    """``max_new_tokens`` is already clamped to the model's bound by the gateway."""

    request_id: str
    image: bytes
    max_new_tokens: int
    table_bboxes: list[Box] = field(default_factory=list)
    max_pixels: int = MAX_IMAGE_PIXELS


@dataclass
class ParseHeadResult:
    field: ParseField
    value: str | list[str]


DetectHeadReply = DetectHeadResult | HeadFailure
ParseHeadReply = ParseHeadResult | HeadFailure
