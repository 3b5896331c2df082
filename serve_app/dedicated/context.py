"""What every long-lived part of the dedicated subsystem is built on, passed as one value.

The reconciler and the router (and the service behind the routes) read the same store,
offerings, options, Serve backend and clock; the facade builds this once instead of each
constructor repeating the five arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from serve_app.dedicated.control.backend import ServeBackend
from serve_app.dedicated.offer.catalog import Offerings
from serve_app.dedicated.options import DedicatedOptions
from serve_app.dedicated.store import DedicatedStore
from serve_app.storage.schema import utcnow


@dataclass(frozen=True)
class DedicatedContext:
    store: DedicatedStore
    offerings: Offerings
    options: DedicatedOptions
    backend: ServeBackend
    clock: Callable[[], datetime] = field(default=utcnow)


class BuiltOnContext:
    """Base of the parts built on a ``DedicatedContext``: its fields as attributes."""

    def __init__(self, ctx: DedicatedContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.offerings = ctx.offerings
        self.options = ctx.options
        self.backend = ctx.backend
        self.clock = ctx.clock
