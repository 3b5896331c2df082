"""A port held only by lingering (TIME_WAIT) connections is told apart from one in use."""

from __future__ import annotations

import socket

import pytest

from serve_app.ingress import direct_port
from serve_app.ingress.direct_port import lingering, wait_for_direct_port


def _listener() -> socket.socket:
    """Bound as Ray Serve binds a replica's server: without ``SO_REUSEADDR``."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def _leave_time_wait() -> int:
    """A port whose server closed a connection first, then stopped listening."""
    server = _listener()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end goes to TIME_WAIT
    client.recv(1)
    client.close()
    server.close()
    return port


def test_time_wait_only_is_lingering() -> None:
    port = _leave_time_wait()
    assert lingering(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError):  # why the bind test alone cannot tell
            sock.bind(("0.0.0.0", port))


def test_a_listening_port_is_in_use_not_lingering() -> None:
    server = _listener()
    try:
        assert not lingering(server.getsockname()[1])
    finally:
        server.close()


async def test_the_replica_waits_while_its_port_lingers(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _leave_time_wait()
    monkeypatch.setenv("RAY_SERVE_ENABLE_DIRECT_INGRESS", "1")
    monkeypatch.setenv("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", str(port))
    checks: list[int] = []
    real = direct_port.lingering

    def counted(p: int) -> bool:
        checks.append(p)
        return real(p) and len(checks) < 3  # "the connections expire" after two waits

    monkeypatch.setattr(direct_port, "lingering", counted)
    monkeypatch.setattr(direct_port.asyncio, "sleep", _no_sleep)
    await wait_for_direct_port(bound_s=30)
    assert checks == [port, port, port]


async def _no_sleep(_: float) -> None:
    return None
