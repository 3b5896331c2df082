"""A named database lease as an object: acquire (take or renew) and release.

The dedicated reconciler's lease row (``DedicatedStore.acquire_lease``) is the one way
gateway replicas take turns; the heads' memory budget keeper takes its turn the same way
under its own name (``serve_app.heads.budget.Lease``).
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import UTC, datetime

from serve_app.dedicated.store import DedicatedStore


class StoreLease:
    """One named lease row, held by this process while it renews it within ``ttl_s``."""

    def __init__(self, store: DedicatedStore, name: str, ttl_s: float = 30.0) -> None:
        self._store = store
        self._name = name
        self._ttl_s = ttl_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    def acquire(self) -> bool:
        return self._store.acquire_lease(self._name, self.holder, self._ttl_s, datetime.now(UTC))

    def release(self) -> None:
        self._store.release_lease(self._name, self.holder)
