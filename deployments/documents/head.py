"""The detect and parse heads: one Ray Serve deployment per document model.

``DetectHeadCore`` and ``ParseHeadCore`` hold the head's rules (decode the
image the gateway sniffed, require table boxes from table-structure engines,
shape the result) as plain async Python, so the gateway's tests run them
in-process; ``DetectHead`` / ``ParseHead`` are the thin Ray Serve wrappers.
Decoding runs in a worker thread next to the model: it is CPU work, and the
compressed image is the smallest thing to ship to a head.
"""

from __future__ import annotations

import asyncio
import io
import warnings
from typing import TYPE_CHECKING

from ray import serve

from deployments.documents.base import (
    DetectEngine,
    ParseEngine,
    ParseEngineInfo,
    ParseOptions,
)
from deployments.engine_head import EngineHead, answer_as_value
from serve_app.contract.documents import (
    MAX_IMAGE_PIXELS,
    DetectHeadReply,
    DetectHeadRequest,
    DetectHeadResult,
    ParseHeadReply,
    ParseHeadRequest,
    ParseHeadResult,
    Region,
    too_many_pixels,
)
from serve_app.contract.errors import (
    InvalidRequestError,
    ModelUnavailableError,
)

if TYPE_CHECKING:
    from PIL import Image


def decode_image(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """The RGB image in ``data``, or ``invalid_image``.

    The size is read from the header and checked against ``max_pixels`` before a
    single pixel is decoded: a decompression bomb (kilobytes of PNG declaring
    gigapixels) is refused instead of filling the replica's memory.
    """
    from PIL import Image as PilImage

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PilImage.DecompressionBombWarning)
            with PilImage.open(io.BytesIO(data)) as img:
                width, height = img.size
                if width * height > max_pixels:
                    raise too_many_pixels(width, height, max_pixels)
                img.load()
                return img.convert("RGB")
    except PilImage.DecompressionBombError:
        raise too_many_pixels(None, None, max_pixels) from None
    except (OSError, ValueError, SyntaxError) as err:
        raise InvalidRequestError(
            f"Invalid image: it could not be decoded ({type(err).__name__}).",
            code="invalid_image",
            param="image",
        ) from None


def inside(regions: list[Region], width: int, height: int) -> list[Region]:
    """Boxes clipped to the image (detectors may reach past its edge); empty ones dropped.

    Detect boxes are valid ``table_bboxes`` of parse as they are, and parse refuses
    boxes outside the image, so a box is never handed out that parse would refuse.
    """
    kept = []
    for region in regions:
        x0, y0, x1, y1 = region.box
        box = [
            round(min(max(x0, 0.0), width), 1),
            round(min(max(y0, 0.0), height), 1),
            round(min(max(x1, 0.0), width), 1),
            round(min(max(y1, 0.0), height), 1),
        ]
        if box[0] < box[2] and box[1] < box[3]:
            kept.append(Region(label=region.label, score=region.score, box=box))
    return kept


class DetectHeadCore:
    """Image decoding and result shaping around one ``DetectEngine``."""

    def __init__(self, engine: DetectEngine) -> None:
        self.engine = engine
        self.started = False

    async def start(self) -> None:
        await self.engine.start()
        self.started = True

    async def detect(self, request: DetectHeadRequest) -> DetectHeadReply:
        reply: DetectHeadReply = await answer_as_value(
            "detection", request.request_id, self._detect(request)
        )
        return reply

    async def _detect(self, request: DetectHeadRequest) -> DetectHeadResult:
        if not self.started:
            raise ModelUnavailableError("The detect head is still starting.", code="model_warming")
        image = await asyncio.to_thread(decode_image, request.image, request.max_pixels)
        regions = await self.engine.detect(image)
        return DetectHeadResult(regions=inside(regions, image.width, image.height))


class ParseHeadCore:
    """Image decoding, table-box rule and result shaping around one ``ParseEngine``."""

    def __init__(self, engine: ParseEngine) -> None:
        self.engine = engine
        self.info: ParseEngineInfo | None = None

    async def start(self) -> ParseEngineInfo:
        self.info = await self.engine.start()
        return self.info

    async def parse(self, request: ParseHeadRequest) -> ParseHeadReply:
        reply: ParseHeadReply = await answer_as_value(
            "parse", request.request_id, self._parse(request)
        )
        return reply

    async def _parse(self, request: ParseHeadRequest) -> ParseHeadResult:
        info = self.info
        if info is None:
            raise ModelUnavailableError("The parse head is still starting.", code="model_warming")
        if info.needs_table_bboxes and not request.table_bboxes:
            raise InvalidRequestError(
                "This model needs table_bboxes (pixel boxes of the tables, e.g. from /v1/detect).",
                code="missing_required_parameter",
                param="table_bboxes",
            )
        image = await asyncio.to_thread(decode_image, request.image, request.max_pixels)
        options = ParseOptions(
            max_new_tokens=request.max_new_tokens,
            table_bboxes=request.table_bboxes if info.needs_table_bboxes else [],
        )
        output = await self.engine.parse(image, options)
        return ParseHeadResult(field=info.field, value=output.value)


@serve.deployment(ray_actor_options={"num_cpus": 0.25})
class DetectHead(EngineHead):
    """Ray Serve replica hosting one detect engine, built by the backend registry."""

    kind = "detect"
    core_class = DetectHeadCore
    core: DetectHeadCore

    async def detect(self, request: DetectHeadRequest) -> DetectHeadReply:
        return await self.core.detect(request)


@serve.deployment(ray_actor_options={"num_cpus": 0.25})
class ParseHead(EngineHead):
    """Ray Serve replica hosting one parse engine, built by the backend registry."""

    kind = "parse"
    core_class = ParseHeadCore
    core: ParseHeadCore

    async def parse(self, request: ParseHeadRequest) -> ParseHeadReply:
        return await self.core.parse(request)
