"""Everything dedicated in one gateway replica: what routes call and what the root wires.

The service and the redeploys are blocking (database); this facade runs them
in a thread, keeps the alias cache current with this replica's own writes,
and owns the two background loops (alias refresh, reconciler).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from serve_app.auth.principal import Principal
from serve_app.catalog.config import CatalogModel
from serve_app.dedicated.api.operations import DedicatedService
from serve_app.dedicated.api.redeploy import Redeploys
from serve_app.dedicated.api.telemetry import WINDOWS, replica_health, scaling_history, telemetry
from serve_app.dedicated.context import DedicatedContext
from serve_app.dedicated.control.backend import ServeBackend
from serve_app.dedicated.control.reconciler import Reconciler
from serve_app.dedicated.offer.catalog import Offerings
from serve_app.dedicated.options import DedicatedOptions
from serve_app.dedicated.routing.floor import FloorCounts
from serve_app.dedicated.routing.router import DedicatedRouter
from serve_app.dedicated.store import DedicatedStore
from serve_app.protocol.dedicated import (
    DedicatedCreateRequest,
    DedicatedEndpoint,
    DedicatedEngineChange,
    DedicatedModeChange,
    DedicatedModePreview,
    DedicatedModeTarget,
    DedicatedPatchRequest,
    DedicatedRateCard,
    DedicatedReplicaHealth,
    DedicatedScalingHistory,
    DedicatedTelemetry,
    Window,
)
from serve_app.storage.db import Database
from serve_app.storage.schema import utcnow

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Dedicated:
    """The dedicated-endpoints subsystem of one gateway replica."""

    def __init__(
        self,
        options: DedicatedOptions,
        store: DedicatedStore,
        offerings: Offerings,
        backend: ServeBackend,
        clock: Callable[[], datetime] = utcnow,
        floor: FloorCounts | None = None,
    ) -> None:
        self.options = options
        self.store = store
        self.backend = backend
        self.clock = clock
        ctx = DedicatedContext(store, offerings, options, backend, clock)
        self.service = DedicatedService(store, offerings, options, clock)
        self.redeploys = Redeploys(self.service)
        self.router = DedicatedRouter(ctx, floor)
        self.reconciler = Reconciler(ctx)

    # ---- lifecycle ---------------------------------------------------------------
    def start(self, reconcile: bool = True) -> None:
        """Start the loops on the running event loop (a Serve replica's)."""
        self.router.start()
        if reconcile:
            self.reconciler.start()

    async def stop(self) -> None:
        await self.reconciler.stop()
        await self.router.stop()

    def converge_now(self) -> None:
        """One reconcile pass and a cache refresh (blocking; tests and tools)."""
        self.reconciler.converge_once()
        self.router.refresh()

    async def _write(self, call: Callable[[], DedicatedEndpoint]) -> DedicatedEndpoint:
        def run() -> DedicatedEndpoint:
            view = call()
            row = self.store.get(view.endpoint_id)
            if row is not None:
                self.router.remember(row)
            return view

        return await asyncio.to_thread(run)

    async def _read(self, call: Callable[[], T]) -> T:
        return await asyncio.to_thread(call)

    # ---- the routes ----------------------------------------------------------------
    async def list(self, principal: Principal) -> list[DedicatedEndpoint]:
        return await self._read(lambda: self.service.list(principal))

    async def get(self, endpoint_id: str, principal: Principal) -> DedicatedEndpoint:
        return await self._read(lambda: self.service.get(endpoint_id, principal))

    async def rates(self, principal: Principal) -> DedicatedRateCard:
        return self.service.rates(principal)

    async def create(self, body: DedicatedCreateRequest, principal: Principal) -> DedicatedEndpoint:
        return await self._write(lambda: self.service.create(body, principal))

    async def patch(
        self, endpoint_id: str, body: DedicatedPatchRequest, principal: Principal
    ) -> DedicatedEndpoint:
        return await self._write(lambda: self.service.patch(endpoint_id, body, principal))

    async def delete(self, endpoint_id: str, principal: Principal) -> DedicatedEndpoint:
        return await self._write(lambda: self.service.delete(endpoint_id, principal))

    async def pause(self, endpoint_id: str, principal: Principal) -> DedicatedEndpoint:
        return await self._write(lambda: self.service.pause(endpoint_id, principal))

    async def resume(self, endpoint_id: str, principal: Principal) -> DedicatedEndpoint:
        return await self._write(lambda: self.service.resume(endpoint_id, principal))

    async def preview(
        self, endpoint_id: str, body: DedicatedModeTarget, principal: Principal
    ) -> DedicatedModePreview:
        return await self._read(lambda: self.redeploys.preview(endpoint_id, body, principal))

    async def change_mode(
        self, endpoint_id: str, body: DedicatedModeChange, principal: Principal
    ) -> DedicatedEndpoint:
        return await self._write(lambda: self.redeploys.change_mode(endpoint_id, body, principal))

    async def change_engine(
        self, endpoint_id: str, body: DedicatedEngineChange, principal: Principal
    ) -> DedicatedEndpoint:
        return await self._write(lambda: self.redeploys.change_engine(endpoint_id, body, principal))

    async def telemetry(
        self, endpoint_id: str, window: Window, principal: Principal
    ) -> DedicatedTelemetry:
        def read() -> DedicatedTelemetry:
            row = self.service.require(endpoint_id, principal)
            self.router.flush()  # this replica's latest calls count too
            now = self.clock()
            rows = self.store.requests_since(row.id, now - WINDOWS[window])
            return telemetry(rows, window, now, row.block_tokens)

        return await asyncio.to_thread(read)

    async def history(
        self, endpoint_id: str, limit: int | None, principal: Principal
    ) -> DedicatedScalingHistory:
        def read() -> DedicatedScalingHistory:
            row = self.service.require(endpoint_id, principal)
            self.router.flush()
            wanted = min(limit or self.options.history_limit, self.options.history_limit)
            return scaling_history(self.store, row, wanted, self.clock())

        return await asyncio.to_thread(read)

    async def health(self, endpoint_id: str, principal: Principal) -> DedicatedReplicaHealth:
        row = await self._read(lambda: self.service.require(endpoint_id, principal))
        return await replica_health(row, self.backend, self.options, self.clock())


def build_dedicated(
    options: DedicatedOptions,
    models: Iterable[CatalogModel],
    database: Database,
    backend: ServeBackend | None,
    **kwargs: Any,
) -> Dedicated | None:
    """The subsystem on ``database`` and ``backend`` for the catalog's ``models``; None
    when disabled or without Serve.

    Built before the catalog and the text service, which take its router's hooks at
    construction (``router.resolve_model``, ``router.head_for``).
    """
    if backend is None or not options.enabled:
        return None
    offerings = Offerings(models, options)
    return Dedicated(options, DedicatedStore(database), offerings, backend, **kwargs)
