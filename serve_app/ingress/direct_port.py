"""A restarted gateway replica gets its direct-ingress port back, not the next one.

Under ``gateway run`` the gateway replica serves ``--port`` itself (Serve's direct
ingress). When a replica dies with client connections open, the kernel keeps those
connections in TIME_WAIT on that port for 60 s, and Ray Serve binds the replica's
server without ``SO_REUSEADDR``: the bind fails, Serve blocks the port for good and
starts the server on the next port of the range. Every client of ``--port`` then
got "connection refused" until the whole stack restarted (found by the fault suite).
Serve starts that server right after the replica's constructor returns, so the
constructor first waits, boundedly, until only the lingering connections were in
the way.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

logger = logging.getLogger(__name__)

LINGER_BOUND_S = 75.0
"""TIME_WAIT lasts 60 s on Linux; a little more, then Serve's own fallback applies."""


def _bindable(port: int) -> bool:
    """Serve's bind (no ``SO_REUSEADDR``) would succeed now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def _listening(port: int) -> bool:
    """Some socket of this machine listens on ``port`` (the kernel's TCP tables)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def lingering(port: int) -> bool:
    """Closed connections (TIME_WAIT, FIN_WAIT) hold ``port``; nobody listens on it.

    The dead replica's sockets had no ``SO_REUSEADDR``, so even a bind that sets it would
    fail: only the kernel's tables tell lingering connections from a listener.
    """
    return not _bindable(port) and not _listening(port)


async def wait_for_direct_port(bound_s: float = LINGER_BOUND_S) -> None:
    """With Serve's direct ingress on, wait while the first port of its range lingers."""
    if os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") != "1":
        return
    port = int(os.environ.get("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "0"))
    if not port or not lingering(port):
        return
    started = time.monotonic()
    logger.warning("port %d still holds a lost replica's connections; waiting to reuse it", port)
    while lingering(port) and time.monotonic() - started < bound_s:
        await asyncio.sleep(1.0)
    logger.info("port %d free after %.0f s", port, time.monotonic() - started)
