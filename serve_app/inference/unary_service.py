"""What the services of unary heads share: the head lookup and one metered head call.

Speech, transcription, detect, parse and the pooling heads (embeddings, scores) each
answer a request with one head call (no stream) whose cost is known or bounded before
it, whether the record is priced per unit (seconds of audio, images) or per token
(embeddings). So they share the same steps after their own request rules: the model
must have a head and it must be ready (503), then limits are admitted (429), the head
is called within the route's timeout (504), its ``HeadFailure`` becomes the error it
carries, and exactly one usage record is written (or the reservation released, when
the call failed). ``AudioService``, ``DocumentService`` and ``EmbeddingService`` add
only their rules and answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from serve_app.billing.records import UsageQuantities
from serve_app.catalog.catalog import Catalog
from serve_app.catalog.config import CatalogModel
from serve_app.contract.errors import HeadFailure
from serve_app.inference.metering import Metering, RequestMeta
from serve_app.inference.readiness import HeadReadiness
from serve_app.inference.unary_metering import UnaryMetering
from serve_app.protocol.errors import ModelUnavailableError, UpstreamTimeoutError

Client = TypeVar("Client")
Result = TypeVar("Result")


class UnaryHeadService:
    """Base of the services that make one head call per request: catalog, readiness
    and metering of one replica."""

    def __init__(
        self, catalog: Catalog, readiness: HeadReadiness, metering: Metering | None
    ) -> None:
        self.catalog = catalog
        self.readiness = readiness
        self.usage = UnaryMetering(metering or Metering())

    def _ready(self, heads: Mapping[str, Client], model: CatalogModel) -> Client:
        """The model's head client; 503 when it has none or its head is still warming."""
        client = heads.get(model.id)
        if client is None:
            raise ModelUnavailableError(f"Model '{model.id}' has no serving head.")
        self.readiness.check(model.id)
        return client

    async def _metered(
        self,
        meta: RequestMeta,
        call: Callable[[], Awaitable[Any]],
        timeout_s: float,
        result_type: type[Result],
        usage_of: Callable[[Result], UsageQuantities],
        *,
        reserve_tokens: int = 0,
        check: Callable[[Result], None] | None = None,
    ) -> Result:
        """Admit, call the head within ``timeout_s``, then bill ``usage_of`` the result
        (or release the reservation unbilled) once. ``check`` raises on a reply the head
        should not have sent (a 502, unbilled)."""
        ticket = await self.usage.admit(meta, reserve_tokens)
        usage: UsageQuantities | None = None
        try:
            try:
                # A timeout scope, not ``wait_for``: no second task and loop turn per call.
                async with asyncio.timeout(timeout_s):
                    reply = await call()
            except TimeoutError:
                raise UpstreamTimeoutError(
                    f"Model '{meta.model.id}' did not answer within {timeout_s:g} s."
                ) from None
            if isinstance(reply, HeadFailure):
                raise reply.to_error()
            self.readiness.note_answering(meta.model.id)
            if not isinstance(reply, result_type):
                raise TypeError(f"head returned {type(reply).__name__}")
            if check is not None:
                check(reply)
            usage = usage_of(reply)
            return reply
        finally:
            await self.usage.finish(meta, ticket, usage)
