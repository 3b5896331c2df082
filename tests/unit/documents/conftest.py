"""Document heads for the in-process gateway: the real CPU engines, loaded once.

The ONNX heads (RapidLayout, RapidOCR, RapidTable) read real text and tables;
trocr, deplot and pix2text run their transformers code on tiny random-weight
models built into a session temporary folder (no hub, no state dir touched).
Each test gets a fresh app, database and ledger around the same heads.
Images are drawn here with Pillow, so every input is known exactly.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw, ImageFont

from deployments import registry
from deployments.documents.base import (
    ParseEngine,
    ParseEngineInfo,
    ParseOptions,
    ParseOutput,
)
from deployments.documents.head import DetectHeadCore, ParseHeadCore
from serve_app.heads.client import DocumentClient, LocalDocumentClient
from tests.fixtures.gateway import CATALOG, GatewayHarness, add_keys, build_harness

SENTENCE = "The quick brown fox jumps over the lazy dog"
TABLE = [["Region", "Q1", "Q2"], ["North", "120", "135"], ["South", "480", "510"]]
_PRICE = {"mode": "fixed", "per_image": 0.01}


def _entry(model_id: str, head: str, backend: str, **extra: Any) -> dict[str, Any]:
    config = extra.pop("config", {})
    return {
        "id": model_id,
        "head": head,
        "input_modalities": ["image"],
        "pricing": _PRICE,
        "engine": {"backend": backend, "config": config},
        **extra,
    }


def document_catalog(models_dir: Path) -> list[dict[str, Any]]:
    tiny = {"models_dir": str(models_dir), "device": "cpu"}
    ved = {"model": "tiny:vision-encoder-decoder", **tiny}
    return [
        _entry("tatr", "detect", "rapid-layout", specialties=["table-structure"]),
        _entry(
            "tatr-hf",
            "detect",
            "table-transformer",
            config={"model": "tiny:table-transformer", "threshold": 0.0, **tiny},
        ),
        _entry("got-ocr-2", "parse", "rapidocr", max_output_tokens=4096),
        _entry("tableformer", "parse", "rapid-table", specialties=["table-structure"]),
        _entry(
            "trocr",
            "parse",
            "vision-encoder-decoder",
            max_output_tokens=8,
            config={**ved, "field": "text"},
        ),
        _entry("pix2text", "parse", "vision-encoder-decoder", config={**ved, "field": "output"}),
        _entry(
            "deplot",
            "parse",
            "pix2struct",
            max_output_tokens=16,
            config={"model": "tiny:pix2struct", "field": "table", **tiny},
        ),
        _entry("slow-parse", "parse", "scripted"),
        _entry("broken-parse", "parse", "scripted"),
    ]


class ScriptedParse(ParseEngine):
    """Answers after ``delay_s`` or fails: the gateway's 504 and 502 paths."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.delay_s, self.fail = delay_s, fail

    async def start(self) -> ParseEngineInfo:
        return ParseEngineInfo(field="text")

    async def parse(self, image: Image.Image, options: ParseOptions) -> ParseOutput:
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("model exploded")
        return ParseOutput(value="late")


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def document_heads(tiny_models_dir: Path) -> dict[str, DocumentClient]:
    """Every head of ``document_catalog``, started once for the session."""
    models_dir = tiny_models_dir
    heads: dict[str, DocumentClient] = {}

    async def start() -> None:
        for entry in document_catalog(models_dir):
            backend, config = entry["engine"]["backend"], entry["engine"]["config"]
            core: DetectHeadCore | ParseHeadCore
            if backend == "scripted":
                slow = entry["id"] == "slow-parse"
                core = ParseHeadCore(ScriptedParse(delay_s=5 if slow else 0, fail=not slow))
            elif entry["head"] == "detect":
                core = DetectHeadCore(registry.build_engine("detect", backend, config))
            else:
                core = ParseHeadCore(registry.build_engine("parse", backend, config))
            await core.start()
            heads[entry["id"]] = LocalDocumentClient(core)

    asyncio.run(start())
    return heads


DocFactory = Callable[..., Awaitable[GatewayHarness]]


@pytest.fixture
async def make_doc_gateway(
    tmp_path: Path, tiny_models_dir: Path, document_heads: dict[str, DocumentClient]
) -> AsyncIterator[DocFactory]:
    """``await make_doc_gateway(documents={...})``: the app with every document head wired."""
    made: list[GatewayHarness] = []

    async def make(**args: Any) -> GatewayHarness:
        folder = tmp_path / f"gw{len(made)}"
        folder.mkdir()
        catalog = [*CATALOG, *document_catalog(tiny_models_dir)]
        harness = build_harness(
            folder / "gw.db", {"catalog": catalog, **args}, document_heads=document_heads
        )
        add_keys(harness)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        await harness.aclose()


@pytest.fixture
async def doc_gw(make_doc_gateway: DocFactory) -> GatewayHarness:
    return await make_doc_gateway()


def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        return ImageFont.load_default(size)


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def b64(image: Image.Image) -> str:
    return base64.b64encode(png(image)).decode("ascii")


def data_uri(image: Image.Image) -> str:
    return f"data:image/png;base64,{b64(image)}"


def sentence_image(text: str = SENTENCE) -> Image.Image:
    image = Image.new("RGB", (900, 120), "white")
    ImageDraw.Draw(image).text((30, 35), text, fill="black", font=font(36))
    return image


def draw_table(draw: ImageDraw.ImageDraw, x0: int, y0: int) -> tuple[int, int, int, int]:
    """The 3x3 ``TABLE`` with ruled cells at (x0, y0); returns its pixel box."""
    cw, rh = 200, 60
    for r, row in enumerate(TABLE):
        for c, cell in enumerate(row):
            box = (x0 + c * cw, y0 + r * rh, x0 + (c + 1) * cw, y0 + (r + 1) * rh)
            draw.rectangle(box, outline="black", width=2)
            draw.text((box[0] + 20, box[1] + 16), cell, fill="black", font=font(26))
    return x0, y0, x0 + cw * len(TABLE[0]), y0 + rh * len(TABLE)


def page_with_table() -> tuple[Image.Image, tuple[int, int, int, int]]:
    """A report page: a title, a paragraph, then the table."""
    image = Image.new("RGB", (800, 1000), "white")
    draw = ImageDraw.Draw(image)
    draw.text((60, 60), "Quarterly report of the sales team", fill="black", font=font(28))
    for i in range(4):
        line = "Lorem ipsum dolor sit amet, consectetur adipiscing elit sed do."
        draw.text((60, 120 + i * 30), line, fill="black", font=font(18))
    return image, draw_table(draw, 100, 320)


def bar_chart() -> Image.Image:
    image = Image.new("RGB", (320, 240), "white")
    draw = ImageDraw.Draw(image)
    draw.line((30, 210, 300, 210), fill="black", width=2)
    draw.line((30, 20, 30, 210), fill="black", width=2)
    for i, value in enumerate((60, 120, 90, 170)):
        left = 50 + i * 60
        draw.rectangle((left, 210 - value, left + 35, 210), fill="steelblue")
        draw.text((left + 5, 215), f"{2021 + i}", fill="black", font=font(12))
    return image


def formula_image() -> Image.Image:
    image = Image.new("RGB", (360, 100), "white")
    ImageDraw.Draw(image).text((20, 25), "E = mc² + √(a/b)", fill="black", font=font(36))
    return image
