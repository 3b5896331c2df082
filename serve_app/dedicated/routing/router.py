"""Calls through ``ded/<slug>``: alias resolution, call admission, and per-call telemetry.

Each gateway replica keeps the stored endpoints in memory, re-read every
``refresh_s`` (a miss is looked up once in the database, so an alias created
on another replica resolves at once). The catalog asks ``resolve_model`` for
``ded/*`` ids (a private alias resolves only for its own organization, else
404 like any unknown model); the text service asks ``head_for`` for the head,
which answers 503 ``model_warming`` while the endpoint cannot serve and
otherwise returns a client on the endpoint's own Serve app (the embeddings
service asks ``pooling_head_for``, whose client is ``routing.pooling``'s). That client
measures the call (outcome, TTFT, latency, cold wait, tokens, the replica
that served it) into ``dedicated_requests``, written in batches off the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from serve_app.auth.principal import Principal
from serve_app.background import PeriodicLoop
from serve_app.catalog.config import CatalogModel, PricingConfig
from serve_app.contract.chat import GenerationDone, HeadEvent, HeadRequest, TextDelta
from serve_app.contract.dedicated import ServedBy
from serve_app.contract.errors import HeadFailure
from serve_app.dedicated.alias import app_name_for, is_dedicated_alias, slug_of
from serve_app.dedicated.api.views import admit_call
from serve_app.dedicated.context import BuiltOnContext, DedicatedContext
from serve_app.dedicated.offer.scaling import BURST, HEAD
from serve_app.dedicated.routing.floor import FloorCounts, LocalFloorCounts
from serve_app.dedicated.routing.pooling import DedicatedPoolingClient
from serve_app.dedicated.store import EndpointRow
from serve_app.heads.client import HeadClient, PoolingClient
from serve_app.protocol.errors import GatewayError, model_not_found

logger = logging.getLogger(__name__)

RECHECK_INTERVAL_S = 0.25
"""A refused call re-reads its endpoint at most this often (the cache may be behind)."""


@dataclass
class CallRecord:
    """One call's measurements, filled in as its events pass."""

    endpoint_id: str
    woke: bool
    at: datetime
    started: float = field(default_factory=time.monotonic)
    replica_id: str | None = None
    first_event: float | None = None
    first_token: float | None = None
    ended: float | None = None
    done: GenerationDone | None = None
    failed: bool = False

    def observe(self, event: HeadEvent | ServedBy) -> None:
        now = time.monotonic()
        if self.first_event is None:
            self.first_event = now
        if isinstance(event, ServedBy):
            self.replica_id = event.replica_id
        elif isinstance(event, TextDelta) and self.first_token is None:
            self.first_token = now
        elif isinstance(event, GenerationDone):
            self.done, self.ended = event, now
        elif isinstance(event, HeadFailure):
            self.failed = True

    def row(self) -> dict[str, Any]:
        def ms(at: float | None) -> int | None:
            return None if at is None else int((at - self.started) * 1000)

        if self.done is not None and not self.failed:
            outcome = "ok"
        else:
            outcome = "incomplete" if self.first_token is not None else "error"
        done = self.done
        return {
            "endpoint_id": self.endpoint_id,
            "at": self.at,
            "outcome": outcome,
            "replica_id": self.replica_id,
            "woke": self.woke,
            "ttft_ms": ms(self.first_token),
            "latency_ms": ms(self.ended or time.monotonic()),
            "cold_wait_ms": ms(self.first_event) if self.woke else None,
            "cached_tokens": None if done is None else done.cached_tokens,
            "prompt_tokens": 0 if done is None else done.prompt_tokens,
            "completion_tokens": 0 if done is None else done.completion_tokens,
        }


class DedicatedHeadClient:
    """A head client for one call to one endpoint's Serve app.

    A call that wakes an endpoint at rest gets its first event only once Serve has
    booted a replica (weights loaded), so it asks the text service for
    ``wake_timeout_s`` instead of the ordinary first-event allowance
    (``first_event_s``; None keeps the gateway's).
    """

    def __init__(self, router: DedicatedRouter, row: EndpointRow, woke: bool) -> None:
        self.router = router
        self.row = row
        self.woke = woke
        self.first_event_s: float | None = router.options.wake_timeout_s if woke else None

    async def stream(self, request: HeadRequest) -> AsyncIterator[HeadEvent]:
        app = app_name_for(self.row.slug)
        call_id = f"{request.request_id}:{uuid.uuid4().hex[:12]}"  # unique per model turn
        deployment = await self.router.choose_deployment(self.row, call_id)
        inner = self.router.backend.head_client(app, deployment, self.row.alias)
        record = CallRecord(self.row.id, self.woke, at=self.router.clock())
        key = (app, deployment)
        self.router.in_flight[key] += 1
        try:
            async for event in inner.stream(request):
                record.observe(event)
                if not isinstance(event, ServedBy):
                    yield event
        finally:
            self.router.in_flight[key] -= 1
            self.router.pending_rows.append(record.row())
            if self.router.counts_floor(self.row):
                await self.router.floor.release(app, deployment, call_id)


class DedicatedRouter(BuiltOnContext):
    """Alias -> endpoint cache, admission and head clients for one gateway replica."""

    def __init__(self, ctx: DedicatedContext, floor: FloorCounts | None = None) -> None:
        super().__init__(ctx)
        self.floor: FloorCounts = floor or LocalFloorCounts()
        """Calls on hybrid floors, shared by every gateway replica when Redis is set."""
        self.in_flight: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.pending_rows: list[dict[str, Any]] = []
        self._by_alias: dict[str, EndpointRow] = {}
        self._rechecked: dict[str, float] = {}
        self._loop = PeriodicLoop(
            lambda: asyncio.to_thread(self.refresh),
            lambda: self.options.refresh_s,
            logger=logger,
            failure="could not refresh dedicated endpoints",
            level=logging.WARNING,
        )

    # ---- cache -------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read every live endpoint and write buffered call records (blocking)."""
        rows = self.store.list_live()
        self._by_alias = {row.alias: row for row in rows}
        self.flush()

    def flush(self) -> None:
        batch, self.pending_rows = self.pending_rows, []
        if batch:
            try:
                self.store.add_requests(batch)
            except Exception:
                logger.warning("dropped %d dedicated call records", len(batch), exc_info=True)

    def remember(self, row: EndpointRow) -> None:
        """Take a row this replica just wrote, without waiting for the next refresh."""
        self._by_alias[row.alias] = row

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        await asyncio.to_thread(self.flush)
        await self.floor.aclose()

    def row_for(self, alias: str) -> EndpointRow | None:
        row = self._by_alias.get(alias)
        if row is None and slug_of(alias) is not None:
            row = self.store.by_alias(alias)  # rare: created elsewhere since the last refresh
            if row is not None:
                self._by_alias[alias] = row
        return row

    # ---- the hooks of the catalog and the text service -------------------------------
    def resolve_model(self, model_id: str, principal: Principal) -> CatalogModel | None:
        """The chat model behind the caller's alias (priced at zero: minutes are billed)."""
        row = self.row_for(model_id)
        if row is None or row.org_id != principal.org_id or row.lifecycle == "deleted":
            return None
        offering = self.offerings.get(row.model_id)
        if offering is None:
            return None
        return offering.model.model_copy(
            update={"id": row.alias, "pricing": PricingConfig(mode="fixed")}
        )

    def head_for(self, model_id: str) -> HeadClient | None:
        """A client for ``ded/<slug>``, 503 while it cannot serve, None for other ids."""
        admitted = self.admit(model_id)
        return None if admitted is None else DedicatedHeadClient(self, *admitted)

    def pooling_head_for(self, model_id: str) -> PoolingClient | None:
        """``head_for`` for the embeddings, rerank and score routes (a pooling endpoint)."""
        admitted = self.admit(model_id)
        return None if admitted is None else DedicatedPoolingClient(self, *admitted)

    def admit(self, model_id: str) -> tuple[EndpointRow, bool] | None:
        """(endpoint, whether the call wakes it) for ``ded/<slug>``; 503 while it cannot
        serve, 404 for an alias that is not stored; None for other ids."""
        if not is_dedicated_alias(model_id):
            return None
        row = self.row_for(model_id)
        if row is None:
            raise model_not_found(model_id)
        try:
            woke = admit_call(row, self.options.warming_retry_after_s)
        except GatewayError:
            # Before refusing, make sure the cache is not just behind the database (the
            # endpoint may have become ready since the last refresh); throttled per alias.
            row = self._recheck(row)
            woke = admit_call(row, self.options.warming_retry_after_s)
        return row, woke

    def _recheck(self, row: EndpointRow) -> EndpointRow:
        now = time.monotonic()
        if now - self._rechecked.get(row.alias, 0.0) < RECHECK_INTERVAL_S:
            return row
        self._rechecked[row.alias] = now
        fresh = self.store.by_alias(row.alias)
        if fresh is None:
            return row
        self._by_alias[row.alias] = fresh
        return fresh

    @staticmethod
    def counts_floor(row: EndpointRow) -> bool:
        """Only a hybrid endpoint with a burst beyond its floor chooses between the two."""
        return row.mode == "hybrid" and row.max_replicas > row.reserved_floor

    async def choose_deployment(self, row: EndpointRow, call_id: str) -> str:
        """Hybrid: the reserved floor first, spot burst once the floor is busy, counted
        over every gateway replica's calls (``serve_app.dedicated.routing.floor``)."""
        if not self.counts_floor(row):
            return HEAD
        cap = row.reserved_floor * self._target_inputs(row)
        return await self.floor.choose(app_name_for(row.slug), HEAD, BURST, cap, call_id)

    def _target_inputs(self, row: EndpointRow) -> int:
        if row.scaling is not None and row.scaling.target_inputs is not None:
            return row.scaling.target_inputs
        preset = self.options.presets.get(self.options.default_profile)
        value = preset.policy.target_inputs if preset else None
        return value or 2
