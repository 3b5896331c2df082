"""How the gateway reaches a detect or parse head: a Ray handle, or in-process.

Both return the head's plain reply (a result or a ``HeadFailure``). The Ray
client is the audio one (``RayAudioClient``): the same mapping of Ray's
failures to 503/502 and the same cancellation when the gateway stops waiting.
"""

from __future__ import annotations

from typing import Any, Protocol

from deployments.document_head import DetectHeadCore, ParseHeadCore
from serve_app.catalog.config import CatalogModel
from serve_app.contract.document import (
    DetectHeadReply,
    DetectHeadRequest,
    ParseHeadReply,
    ParseHeadRequest,
)
from serve_app.contract.errors import HeadFailure
from serve_app.inference.audio_client import RayAudioClient


class DocumentClient(Protocol):
    async def detect(self, request: DetectHeadRequest) -> DetectHeadReply: ...

    async def parse(self, request: ParseHeadRequest) -> ParseHeadReply: ...


def _wrong_kind(kind: str) -> HeadFailure:
    return HeadFailure(502, "upstream_error", f"This head does not {kind}.", "upstream_error")


class LocalDocumentClient:
    """Calls a ``DetectHeadCore`` or ``ParseHeadCore`` in this process (tests, benchmarks)."""

    def __init__(self, core: DetectHeadCore | ParseHeadCore) -> None:
        self.core = core

    async def detect(self, request: DetectHeadRequest) -> DetectHeadReply:
        if not isinstance(self.core, DetectHeadCore):
            return _wrong_kind("detect")
        return await self.core.detect(request)

    async def parse(self, request: ParseHeadRequest) -> ParseHeadReply:
        if not isinstance(self.core, ParseHeadCore):
            return _wrong_kind("parse")
        return await self.core.parse(request)


class RayDocumentClient(RayAudioClient):
    """Calls a ``DetectHead`` or ``ParseHead`` deployment through its handle."""

    async def detect(self, request: DetectHeadRequest) -> DetectHeadReply:
        reply: DetectHeadReply = await self._call("detect", request)
        return reply

    async def parse(self, request: ParseHeadRequest) -> ParseHeadReply:
        reply: ParseHeadReply = await self._call("parse", request)
        return reply


def ray_document_clients(
    catalog: list[CatalogModel], heads: dict[str, Any]
) -> dict[str, DocumentClient]:
    """Ray clients for the bound detect and parse heads."""
    return {
        m.id: RayDocumentClient(m.id, heads[m.id])
        for m in catalog
        if m.id in heads and m.head in ("detect", "parse")
    }
