"""Values exchanged between the gateway and the detect/parse heads over a handle.

Plain dataclasses of builtins only, so a head can run in another process or
in-process in tests. The image crosses as the bytes the gateway decoded and
sniffed (never re-encoded); a head answers with its result or one
``HeadFailure``, never by raising, so a 400 found in the head stays a 400.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deployments.engines.document_base import MAX_IMAGE_PIXELS, Box, ParseField, Region
from serve_app.contract.errors import HeadFailure


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
