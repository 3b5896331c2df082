"""Detect and parse: validate, resolve, admit, call the head, answer, bill per image.

The order of checks is the audio routes': catalog (404/403/400, a model of
another route names its route) -> request rules (``stream: true``, table boxes
for table-structure models, the image decoded and sniffed by bytes) ->
readiness (503) -> limits (429) -> head call (502/503, 504 on timeout) -> one
usage record of ``images: 1``. Everything a caller can get wrong is refused
before a head is called, so a bad request never occupies a model replica.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi.responses import JSONResponse

from deployments.document_protocol import (
    DetectHeadRequest,
    DetectHeadResult,
    ParseHeadRequest,
    ParseHeadResult,
)
from deployments.head_protocol import HeadFailure
from serve_app.auth.principal import Principal
from serve_app.billing.records import UsageQuantities
from serve_app.catalog.catalog import Catalog
from serve_app.catalog.config import CatalogModel
from serve_app.inference.audio_service import IGNORED_PARAMS_HEADER
from serve_app.inference.document_client import DocumentClient
from serve_app.inference.images import ImagePolicy, decode_data_uri, validate_image_bytes
from serve_app.inference.metering import Metering, RequestMeta
from serve_app.inference.readiness import HeadReadiness
from serve_app.inference.translate import new_request_id
from serve_app.inference.unit_metering import UnitMetering
from serve_app.protocol.document import (
    DetectedRegion,
    DetectRequest,
    DetectResponse,
    ImageUsage,
    ParseRequest,
    ParseResponse,
)
from serve_app.protocol.errors import (
    InvalidRequestError,
    ModelUnavailableError,
    UpstreamTimeoutError,
)

TABLE_STRUCTURE = "table-structure"
"""Parse models with this specialty (tableformer) read the tables in ``table_bboxes``."""

_R = TypeVar("_R")


@dataclass(frozen=True)
class DocumentPolicy:
    """Timeouts and bounds of the document routes (``GatewayAppArgs.documents``)."""

    detect_timeout_s: float = 120.0
    parse_timeout_s: float = 300.0
    default_max_new_tokens: int = 512
    """Bound of parse models whose catalog entry sets no ``max_output_tokens``."""


class DocumentService:
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
        self.catalog = catalog
        self.heads = heads
        self.readiness = readiness
        self.images = images
        self.policy = policy
        self.usage = UnitMetering(metering or Metering())

    async def detect(self, body: DetectRequest, principal: Principal) -> JSONResponse:
        model = self.catalog.resolve(body.model, principal, "detect")
        _refuse_stream(body.stream)
        image = self._image(body.image)
        client = self._ready(model)
        request = DetectHeadRequest(new_request_id("detect"), image)
        meta = RequestMeta(principal, model, "detect", request.request_id, 1)
        timeout = self.policy.detect_timeout_s
        result = await self._metered(
            meta, lambda: client.detect(request), timeout, DetectHeadResult
        )
        response = DetectResponse(
            id=request.request_id,
            model=model.id,
            regions=[
                DetectedRegion(label=r.label, score=r.score, box=r.box) for r in result.regions
            ],
            usage=ImageUsage(images=1),
        )
        return JSONResponse(response.model_dump(), headers=_ignored(body.extra_fields()))

    async def parse(self, body: ParseRequest, principal: Principal) -> JSONResponse:
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
        image = self._image(body.image)
        client = self._ready(model)
        request = ParseHeadRequest(
            new_request_id("parse"),
            image,
            max_new_tokens=self._max_new_tokens(model, body.max_new_tokens),
            table_bboxes=[list(b) for b in body.table_bboxes or []] if needs_boxes else [],
        )
        meta = RequestMeta(principal, model, "parse", request.request_id, 1)
        timeout = self.policy.parse_timeout_s
        result = await self._metered(meta, lambda: client.parse(request), timeout, ParseHeadResult)
        response = ParseResponse.model_validate(
            {
                "id": request.request_id,
                "model": model.id,
                "usage": {"images": 1},
                result.field: result.value,
            }
        )
        return JSONResponse(
            response.model_dump(exclude_none=True), headers=_ignored(body.extra_fields())
        )

    def _max_new_tokens(self, model: CatalogModel, requested: int | None) -> int:
        """Spec 4.11: the request's value clamped to the model's bound (the bound if omitted)."""
        bound = model.max_output_tokens or self.policy.default_max_new_tokens
        return bound if requested is None else min(requested, bound)

    def _image(self, value: str) -> bytes:
        """Decoded bytes of a base64 string or data URI, checked to be an accepted image."""
        text = value.strip()
        if text.startswith("data:"):
            data = decode_data_uri(text, "image")
        else:
            try:
                data = base64.b64decode("".join(text.split()), validate=True)
            except (binascii.Error, ValueError):
                raise InvalidRequestError(
                    "Invalid image: expected base64 bytes or a data:image/...;base64,... URI.",
                    code="invalid_image",
                    param="image",
                ) from None
        validate_image_bytes(data, "image", self.images)
        return data

    def _ready(self, model: CatalogModel) -> DocumentClient:
        client = self.heads.get(model.id)
        if client is None:
            raise ModelUnavailableError(f"Model '{model.id}' has no serving head.")
        self.readiness.check(model.id)
        return client

    async def _metered(
        self,
        meta: RequestMeta,
        call: Callable[[], Awaitable[Any]],
        timeout_s: float,
        result_type: type[_R],
    ) -> _R:
        """Admit, call the head within ``timeout_s``, then bill one image (or nothing)."""
        ticket = await self.usage.admit(meta, 0)
        usage: UsageQuantities | None = None
        try:
            try:
                reply = await asyncio.wait_for(call(), timeout=timeout_s)
            except TimeoutError:
                raise UpstreamTimeoutError(
                    f"Model '{meta.model.id}' did not answer within {timeout_s:g} s."
                ) from None
            if isinstance(reply, HeadFailure):
                raise reply.to_error()
            if not isinstance(reply, result_type):
                raise TypeError(f"head returned {type(reply).__name__}")
            usage = UsageQuantities(images=1)
            return reply
        finally:
            await self.usage.finish(meta, ticket, usage)


def _refuse_stream(stream: bool | None) -> None:
    if stream:
        raise InvalidRequestError(
            "Streaming is not supported on this route; omit stream or set it to false.",
            code="unsupported_parameter",
            param="stream",
        )


def _ignored(names: list[str]) -> dict[str, str]:
    return {IGNORED_PARAMS_HEADER: ", ".join(sorted(set(names)))} if names else {}
