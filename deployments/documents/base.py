"""The detect and parse engine contracts shared by every document head backend.

A detect head or parse head (``deployments.documents.head``) owns one engine
that it receives from ``deployments.registry.build_engine``: the packaged
ONNX models (RapidLayout, RapidOCR, RapidTable) or a transformers model on tiny
local random weights on CPU, the real transformers checkpoints on a GPU, a
scripted engine in tests of the gateway's own logic.

Contract (read this before writing a backend):

1. ``start`` loads the model once, before the head reports healthy, and returns
   what the head needs to know (which result field the engine fills).
2. ``detect`` / ``parse`` are ``async`` and never block the event loop: the
   model runs in a worker thread (``asyncio.to_thread``), so a replica keeps
   answering health checks while a page is processed.
3. Engines receive a decoded RGB ``PIL.Image``: the head decodes the bytes the
   gateway already sniffed, so no engine parses caller-supplied containers.
4. Boxes are pixel coordinates ``[x0, y0, x1, y1]`` of the image as sent.
5. Caller mistakes raise ``InvalidRequestError``; anything else raises and the
   head reports a 502. Results cross a Ray handle: plain dataclasses only
   (``Region``, ``Box``, ``ParseField`` live in ``serve_app.contract.documents``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from serve_app.contract.documents import Box, ParseField, Region

if TYPE_CHECKING:
    from PIL import Image


@dataclass
class ParseEngineInfo:
    """What a loaded parse model produces and needs."""

    field: ParseField
    needs_table_bboxes: bool = False
    """True for table-structure engines: the caller must say where the tables are."""


@dataclass
class ParseOptions:
    """Request fields a parse engine honours (``max_new_tokens`` already clamped)."""

    max_new_tokens: int
    table_bboxes: list[Box] = field(default_factory=list)


@dataclass
class ParseOutput:
    """The value of the engine's field: a string, or a list of HTML tables."""

    value: str | list[str]


class DetectEngine(abc.ABC):
    """A region detector bound to one loaded checkpoint."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model; called once by the head before it reports healthy."""

    @abc.abstractmethod
    async def detect(self, image: Image.Image) -> list[Region]:
        """Regions of ``image``, best first."""

    async def check_health(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None


class ParseEngine(abc.ABC):
    """An image-to-text/table model bound to one loaded checkpoint."""

    @abc.abstractmethod
    async def start(self) -> ParseEngineInfo:
        """Load the model; called once by the head before it reports healthy."""

    @abc.abstractmethod
    async def parse(self, image: Image.Image, options: ParseOptions) -> ParseOutput:
        """Read ``image`` into the engine's field."""

    async def check_health(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None


def clip_box(box: Box, width: int, height: int) -> tuple[int, int, int, int] | None:
    """``box`` as integer pixels inside the image, or None when it covers nothing."""
    x0, y0, x1, y1 = (float(v) for v in box)
    left, top = max(0, int(min(x0, x1))), max(0, int(min(y0, y1)))
    right, bottom = min(width, round(max(x0, x1))), min(height, round(max(y0, y1)))
    if right - left < 2 or bottom - top < 2:
        return None
    return left, top, right, bottom
