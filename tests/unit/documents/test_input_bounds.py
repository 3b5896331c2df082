"""What a document head does with images of awkward shapes: bounded work, boxes in the image.

A few bytes of PNG can describe a 10 x 2000 strip; an OCR detector that scales
the short side up to its working size would then process ~100 megapixels, and
Pix2Struct's header rendering scales a narrow image up to the header's width.
Both are bounded here, and detectors never hand out a box past the image edge.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from PIL import Image

from deployments.documents.base import DetectEngine
from deployments.documents.head import DetectHeadCore
from deployments.documents.hf_engine import local_font, render_header
from deployments.documents.rapid_engine import MAX_ASPECT, bounded_aspect
from serve_app.contract.documents import DetectHeadRequest, DetectHeadResult, Region
from tests.fixtures.gateway import GatewayHarness
from tests.unit.documents.conftest import b64, page_with_table, png


async def _post(gw: GatewayHarness, path: str, body: dict[str, Any]) -> Any:
    async with gw.client(gw.keys["user"]) as client:
        return await client.post(path, json=body)


def test_ocr_input_is_padded_to_a_bounded_aspect_ratio() -> None:
    strip = np.zeros((2000, 10, 3), np.uint8)
    strip[:, :] = (250, 250, 250)
    padded = bounded_aspect(strip)
    height, width = padded.shape[:2]
    assert height == 2000 and width * MAX_ASPECT >= height
    assert (padded[:, :10] == strip).all()  # the original stays where its boxes are
    assert (padded[:, 10:] == 250).all()  # padding takes the border colour
    normal = np.zeros((120, 900, 3), np.uint8)
    assert bounded_aspect(normal) is normal


def test_pix2struct_header_rendering_is_bounded() -> None:
    narrow = Image.new("RGB", (4, 3000), "white")
    out = render_header(
        narrow, "Generate underlying data table of the figure below:", local_font(None, 24)
    )
    assert out.width * out.height <= 8_000_000
    assert out.height > out.width  # the aspect is kept, only the scale is bounded


async def test_a_thin_strip_is_read_in_seconds(doc_gw: GatewayHarness) -> None:
    """A 10 x 2000 PNG took RapidOCR minutes before padding (736 x 147200 pixels)."""
    started = time.monotonic()
    strip = b64(Image.new("RGB", (10, 2000), "white"))
    reply = await _post(doc_gw, "/v1/parse", {"model": "got-ocr-2", "image": strip})
    assert reply.status_code == 200, reply.text
    assert reply.json()["text"] == ""
    assert time.monotonic() - started < 60


class _Overreaching(DetectEngine):
    """A detector whose boxes reach past the image edge, as DETR-style models' can."""

    async def start(self) -> None:
        return None

    async def detect(self, image: Image.Image) -> list[Region]:
        w, h = image.size
        return [
            Region("table", 0.9, [-12.5, 40.0, w + 30.0, h - 10.0]),
            Region("table", 0.5, [w + 5.0, 0.0, w + 50.0, 20.0]),  # wholly outside
        ]


async def test_detected_boxes_are_clipped_to_the_image() -> None:
    """Parse refuses boxes outside the image, so the detect head never hands one out."""
    core = DetectHeadCore(_Overreaching())
    await core.start()
    page, _ = page_with_table()
    reply = await core.detect(DetectHeadRequest("d", png(page)))
    assert isinstance(reply, DetectHeadResult), reply
    assert [r.box for r in reply.regions] == [[0.0, 40.0, float(page.width), page.height - 10.0]]
