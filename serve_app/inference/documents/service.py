"""Detect and parse: validate, resolve, admit, call the head, answer, bill per image.

The order of checks is the audio routes': catalog (404/403/400, a model of
another route names its route) -> request rules (``stream: true``, table boxes
for table-structure models, the image decoded and sniffed by bytes and its size
bounded, the boxes inside it) ->
readiness (503) -> limits (429) -> head call (502/503, 504 on timeout) -> one
usage record of ``images: 1``. Everything a caller can get wrong is refused
before a head is called, so a bad request never occupies a model replica.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import math
import warnings
from dataclasses import dataclass

from serve_app.auth.principal import Principal
from serve_app.billing.records import UsageQuantities
from serve_app.catalog.catalog import Catalog
from serve_app.catalog.config import CatalogModel
from serve_app.contract.documents import (
    MAX_IMAGE_PIXELS,
    DetectHeadRequest,
    DetectHeadResult,
    ParseHeadRequest,
    ParseHeadResult,
    too_many_pixels,
)
from serve_app.heads.client import DocumentClient
from serve_app.inference.answers import Body
from serve_app.inference.ids import new_request_id
from serve_app.inference.images import ImagePolicy, check_image_bytes
from serve_app.inference.metering import Metering, RequestMeta
from serve_app.inference.readiness import HeadReadiness
from serve_app.inference.unary_service import UnaryHeadService
from serve_app.protocol.documents import (
    DetectedRegion,
    DetectRequest,
    DetectResponse,
    ImageUsage,
    ParseRequest,
    ParseResponse,
)
from serve_app.protocol.errors import InvalidRequestError
from serve_app.protocol.headers import ignored_params_header

TABLE_STRUCTURE = "table-structure"
"""Parse models with this specialty (tableformer) read the tables in ``table_bboxes``."""


@dataclass(frozen=True)
class DocumentPolicy:
    """Timeouts and bounds of the document routes (``GatewayAppArgs.documents``)."""

    detect_timeout_s: float = 120.0
    parse_timeout_s: float = 300.0
    default_max_new_tokens: int = 512
    """Bound of parse models whose catalog entry sets no ``max_output_tokens``."""
    max_image_pixels: int = MAX_IMAGE_PIXELS
    """Largest image (width x height) accepted: bounds what a head has to decode."""


class DocumentService(UnaryHeadService):
    """Serves ``/v1/detect`` and ``/v1/parse`` for the catalog."""

    def __init__(
        self,
        catalog: Catalog,
        heads: dict[str, DocumentClient],
        readiness: HeadReadiness,
        images: ImagePolicy,
        policy: DocumentPolicy,
        metering: Metering | None = None,
    ) -> None:
        super().__init__(catalog, readiness, metering)
        self.heads = heads
        self.images = images
        self.policy = policy

    async def detect(self, body: DetectRequest, principal: Principal) -> Body:
        model = self.catalog.resolve(body.model, principal, "detect")
        _refuse_stream(body.stream)
        image, _ = await asyncio.to_thread(self._image, body.image)
        client = self._ready(self.heads, model)
        request = DetectHeadRequest(
            new_request_id("detect"), image, max_pixels=self.policy.max_image_pixels
        )
        meta = RequestMeta(principal, model, "detect", request.request_id, 1)
        timeout = self.policy.detect_timeout_s
        result = await self._metered(
            meta, lambda: client.detect(request), timeout, DetectHeadResult, _one_image
        )
        response = DetectResponse(
            id=request.request_id,
            model=model.id,
            regions=[
                DetectedRegion(label=r.label, score=r.score, box=r.box) for r in result.regions
            ],
            usage=ImageUsage(images=1),
        )
        headers = ignored_params_header(body.extra_fields())
        return Body.json(response.model_dump(), headers=headers)

    async def parse(self, body: ParseRequest, principal: Principal) -> Body:
        model = self.catalog.resolve(body.model, principal, "parse")
        _refuse_stream(body.stream)
        needs_boxes = TABLE_STRUCTURE in model.specialties
        if needs_boxes and not body.table_bboxes:
            raise InvalidRequestError(
                f"Model '{model.id}' needs table_bboxes: pixel boxes [x0, y0, x1, y1] of the "
                "tables (from /v1/detect, or one box covering the whole page).",
                code="missing_required_parameter",
                param="table_bboxes",
            )
        image, size = await asyncio.to_thread(self._image, body.image)
        boxes = _boxes_inside(body.table_bboxes or [], *size) if needs_boxes else []
        client = self._ready(self.heads, model)
        request = ParseHeadRequest(
            new_request_id("parse"),
            image,
            max_new_tokens=self._max_new_tokens(model, body.max_new_tokens),
            table_bboxes=boxes,
            max_pixels=self.policy.max_image_pixels,
        )
        meta = RequestMeta(principal, model, "parse", request.request_id, 1)
        timeout = self.policy.parse_timeout_s
        result = await self._metered(
            meta, lambda: client.parse(request), timeout, ParseHeadResult, _one_image
        )
        response = ParseResponse.model_validate(
            {
                "id": request.request_id,
                "model": model.id,
                "usage": {"images": 1},
                result.field: result.value,
            }
        )
        headers = ignored_params_header(body.extra_fields())
        return Body.json(response.model_dump(exclude_none=True), headers=headers)

    def _max_new_tokens(self, model: CatalogModel, requested: int | None) -> int:
        """docs/reference/documents.md#parse: the request's value clamped to the model's bound (the
        bound if omitted)."""
        bound = model.max_output_tokens or self.policy.default_max_new_tokens
        return bound if requested is None else min(requested, bound)

    def _image(self, value: str) -> tuple[bytes, tuple[int, int]]:
        """Bytes of a base64 string or data URI, checked to be an accepted image, and its
        size; the pixel bound is checked on the header, before anything is decoded.

        Called in a worker thread: decoding megabytes of base64 and verifying the
        image take milliseconds that other requests on this replica should not wait.
        """
        data = _base64_image(value)
        size = _image_size(data)
        limit = self.policy.max_image_pixels
        if size is None:  # so large that Pillow itself calls it a bomb
            raise too_many_pixels(None, None, limit)
        if size[0] * size[1] > limit:
            raise too_many_pixels(size[0], size[1], limit)
        check_image_bytes(data, "image", self.images)
        return data, size


def _one_image(_: object) -> UsageQuantities:
    """Detect and parse bill one image per answered request (``images: 1``)."""
    return UsageQuantities(images=1)


_PIL_FORMATS = ["PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF"]
_URL_SAFE = str.maketrans("-_", "+/")


def _base64_image(value: str) -> bytes:
    """The bytes of ``value``: raw base64 or a ``data:<type>;base64,`` URI.

    Accepted spellings, all carrying the same bytes: line-wrapped (MIME) base64,
    the URL-safe alphabet, missing ``=`` padding, and a scheme and ``;base64`` in
    any case (RFC 2397). The declared media type is ignored: bytes decide.
    """
    text = value.strip()
    if text[:5].lower() == "data:":
        header, sep, text = text.partition(",")
        if not sep or ";base64" not in header.lower():
            raise _invalid_image("expected a base64 data URI (data:image/...;base64,...)")
    compact = "".join(text.split()).translate(_URL_SAFE)
    compact += "=" * (-len(compact) % 4)
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid_image("expected base64 bytes or a data:image/...;base64,... URI") from None


def _image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the image header, (0, 0) when PIL cannot read it (left to
    the full validation for its message), None when PIL calls it a decompression bomb."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=_PIL_FORMATS) as img:
                width, height = img.size
                return int(width), int(height)
    except Image.DecompressionBombError:
        return None
    except Exception:  # unreadable: check_image_bytes says why
        return 0, 0


def _boxes_inside(boxes: list[list[float]], width: int, height: int) -> list[list[float]]:
    """The pixel boxes of docs/reference/documents.md#parse, each finite and inside the image, else
    400 naming it.

    A box past the edge, inverted, empty or not finite would otherwise come back
    as an empty table (or a failed head): it is the caller's mistake, said at once.
    """
    for i, box in enumerate(boxes):
        x0, y0, x1, y1 = box
        finite = all(math.isfinite(v) for v in box)
        if not (finite and 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
            raise InvalidRequestError(
                f"table_bboxes[{i}] {box} is not a box inside the {width} x {height} image: "
                "pixels [x0, y0, x1, y1] with 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height.",
                code="invalid_value",
                param=f"table_bboxes[{i}]",
            )
    return [list(box) for box in boxes]


def _invalid_image(reason: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid image: {reason}.", code="invalid_image", param="image")


def _refuse_stream(stream: bool | None) -> None:
    if stream:
        raise InvalidRequestError(
            "Streaming is not supported on this route; omit stream or set it to false.",
            code="unsupported_parameter",
            param="stream",
        )
