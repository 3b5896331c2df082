"""``gateway run --ingress``: which Ray settings each mode needs, and its start-up checks."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from serve_app.cli import CommandError, build_parser, ingress


def test_direct_gives_the_gateway_replica_the_port_and_the_span_above_it() -> None:
    env = ingress.ray_env("direct", 8123)
    assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    assert env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] == "8123"
    assert env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] == str(8123 + ingress.PORT_SPAN - 1)
    assert env["RAY_SERVE_PORT_QUARANTINE_S"] == "0"  # a restarted replica gets --port back


def test_proxy_changes_nothing_in_ray() -> None:
    assert ingress.ray_env("proxy", 8123) == {}


def test_run_defaults_to_direct_and_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY_INGRESS", raising=False)
    assert build_parser().parse_args(["run"]).ingress == "direct"
    monkeypatch.setenv("GATEWAY_INGRESS", "proxy")
    assert build_parser().parse_args(["run"]).ingress == "proxy"
    assert build_parser().parse_args(["run", "--ingress", "direct"]).ingress == "direct"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--ingress", "sideways"])


def test_a_taken_port_stops_start_up_before_ray() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(CommandError, match=f"port {port} on 127.0.0.1 is in use"):
            ingress.check_port_free("127.0.0.1", port)
    ingress.check_port_free("127.0.0.1", port)  # released: free again


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[int]:
    server = HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_wait_listening_returns_once_the_replica_answers(health_server: int) -> None:
    ingress.wait_listening("0.0.0.0", health_server, 5.0)  # probed on loopback


def test_wait_listening_names_the_url_when_nothing_answers() -> None:
    port = ingress.free_port("127.0.0.1")
    with pytest.raises(CommandError, match=f"http://127.0.0.1:{port}/healthz"):
        ingress.wait_listening("127.0.0.1", port, 0.3)


def test_a_bad_mode_from_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from serve_app.cli import main

    monkeypatch.setenv("GATEWAY_INGRESS", "sideways")
    assert main(["run", "--config", "configs/local.yaml"]) == 1  # before anything starts
