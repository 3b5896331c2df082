"""How ``gateway run`` takes HTTP in: the gateway replica itself, or Serve's proxy.

``direct`` (the default) uses Ray Serve's direct ingress: the gateway replica runs
its own HTTP server on ``--port`` and clients reach the FastAPI app in one hop.
Through Serve's proxy (``proxy``) a request crosses one more process each way,
and the replica then fetches the request body back from the proxy with one more
actor call before FastAPI can read it. Timed from the client's send to the
chat route on this 2-core box: ~13 ms through the proxy, ~6 ms direct; the first
token's way back ~4 ms against ~2 ms (bench/RESULTS.md, issue 14).

Serve's direct ingress hands each *ingress* replica on a node a port from one
range (``RAY_SERVE_DIRECT_INGRESS_MIN/MAX_HTTP_PORT``), lowest free first. The
gateway application is deployed first, so its replica gets ``--port``; the
ingress replicas of dedicated endpoints' applications, deployed later, get the
ports above it on the same host (they answer nothing useful there: the gateway
reaches them through handles). Serve's proxy still runs, on a free port of the
same host, and routes to every gateway replica: with several gateway replicas
on one node only the first is on ``--port``, so use ``proxy`` for that.
``serve deploy`` on a cluster keeps Serve's proxy unless its environment sets
these variables (docs/deployment.md).
"""

from __future__ import annotations

import errno
import socket
import time

import httpx

from serve_app.cli.errors import CommandError

MODES = ("direct", "proxy")
PORT_SPAN = 64
"""Ports from ``--port`` up that direct ingress may hand out: the gateway's and the
dedicated endpoints' ingress replicas on this node."""


def ray_env(mode: str, port: int) -> dict[str, str]:
    """Environment Ray's processes need for ``mode`` (read by Serve at import)."""
    if mode != "direct":
        return {}
    return {
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + PORT_SPAN - 1),
        # Serve holds a released port back (for HAProxy, unused here) before handing it
        # out again; a restarted gateway replica must get --port back at once.
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
        # Serve keeps a stopping ingress replica answering for 30 s so an external load
        # balancer can take it out; with none in front, Ctrl-C should not wait for it.
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
    }


def check_port_free(host: str, port: int) -> None:
    """Fail before Ray starts when ``port`` is taken: the gateway would land elsewhere."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise CommandError(
                    f"port {port} on {host} is in use; stop what holds it or pass --port"
                ) from None
            raise CommandError(f"cannot bind {host}:{port}: {err}") from None


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_listening(host: str, port: int, timeout_s: float) -> None:
    """Wait for the gateway's own liveness route on ``port`` (direct: its replica)."""
    probe = "127.0.0.1" if host in ("0.0.0.0", "") else host
    url = f"http://{probe}:{port}/healthz"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise CommandError(
                f"the gateway replica is not answering on {url} after {timeout_s:g} s "
                "(direct ingress); see the Serve logs, or start with --ingress proxy"
            )
        time.sleep(0.25)
