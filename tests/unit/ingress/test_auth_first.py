"""The caller is known before any body byte is read (serve_app/ingress/auth_first.py).

The app is driven as ASGI directly with a ``receive`` that counts the body bytes it
hands out: a refusal that read nothing is told apart from one that read everything
by that count, not by timing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from serve_app.requests import deps
from tests.fixtures.gateway import GatewayHarness

MIB = 1024 * 1024
UPLOAD = 150 * MIB
"""A body as large as the issue's: under the files route's limit (200 MB + framing)."""
BOUNDARY = "x-boundary"


@dataclass
class CountingBody:
    """An ASGI ``receive`` that hands out ``size`` bytes in 1 MiB chunks and counts them."""

    size: int
    sent: int = 0
    calls: int = 0

    async def receive(self) -> dict[str, Any]:
        self.calls += 1
        if self.sent >= self.size:
            return {"type": "http.disconnect"}
        chunk = min(MIB, self.size - self.sent)
        self.sent += chunk
        return {"type": "http.request", "body": b"x" * chunk, "more_body": self.sent < self.size}


@dataclass
class Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            self.body.extend(message.get("body", b""))


async def call(
    harness: GatewayHarness,
    path: str,
    body: CountingBody,
    *,
    authorization: str | None,
    declared: bool = True,
    extra: dict[str, str] | None = None,
) -> Answer:
    headers = {"content-type": f"multipart/form-data; boundary={BOUNDARY}", **(extra or {})}
    if declared:
        headers["content-length"] = str(body.size)
    else:
        headers["transfer-encoding"] = "chunked"
    if authorization is not None:
        headers["authorization"] = authorization
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("gateway.test", 80),
    }
    answer = Answer()
    await harness.app(scope, body.receive, answer.send)
    return answer


def bearer(key: str) -> str:
    return f"Bearer {key}"


BAD_CALLERS = {
    "missing": None,
    "not bearer": "Basic abc",
    "malformed": "Bearer not-a-key",
    "unknown": "Bearer gwk_" + "A" * 40,
}
UPLOAD_PATHS = ["/v1/files", "/api/adapters", "/v1/audio/transcriptions"]


@pytest.mark.parametrize("path", UPLOAD_PATHS)
@pytest.mark.parametrize("who", [*BAD_CALLERS, "revoked"])
async def test_an_upload_without_a_valid_key_is_refused_having_read_nothing(
    gateway: GatewayHarness, path: str, who: str
) -> None:
    header = bearer(gateway.keys["revoked"]) if who == "revoked" else BAD_CALLERS[who]
    body = CountingBody(UPLOAD)
    answer = await call(gateway, path, body, authorization=header)
    assert answer.status == 401, answer.body
    assert b'"invalid_api_key"' in answer.body
    assert body.sent == 0 and body.calls == 0
    assert answer.headers["connection"] == "close"  # the server drops the unread bytes


async def test_a_chunked_upload_without_a_key_is_refused_having_read_nothing(
    gateway: GatewayHarness,
) -> None:
    body = CountingBody(UPLOAD)
    answer = await call(gateway, "/v1/files", body, authorization=None, declared=False)
    assert answer.status == 401
    assert body.sent == 0


async def test_a_key_without_the_route_scope_is_refused_before_the_body(
    gateway: GatewayHarness,
) -> None:
    body = CountingBody(UPLOAD)
    answer = await call(gateway, "/v1/files", body, authorization=bearer(gateway.keys["no_scope"]))
    assert answer.status == 403 and b'"insufficient_scope"' in answer.body
    assert body.sent == 0


@pytest.mark.parametrize("who", ["missing", "revoked"])
async def test_idempotency_spools_nothing_for_an_unknown_caller(
    gateway: GatewayHarness, who: str
) -> None:
    """The idempotency middleware spools a body whole before it looks anything up."""
    header = bearer(gateway.keys["revoked"]) if who == "revoked" else None
    body = CountingBody(30 * MIB)  # under the default 32 MiB body limit
    answer = await call(
        gateway,
        "/v1/chat/completions",
        body,
        authorization=header,
        extra={"content-type": "application/json", "idempotency-key": "retry-1"},
    )
    assert answer.status == 401
    assert body.sent == 0


async def test_a_known_caller_s_body_is_read(gateway: GatewayHarness) -> None:
    """The control: the same call with a valid key reads the body (the counter counts)."""
    body = CountingBody(4 * MIB)
    answer = await call(gateway, "/v1/files", body, authorization=bearer(gateway.keys["user"]))
    assert answer.status == 400  # not multipart at all: refused by the parser, after reading
    assert body.sent > 0  # the parser stops at the first chunk that is no multipart


async def test_a_key_revoked_while_its_long_body_arrives_is_refused_after_it(
    gateway: GatewayHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body that took longer than ``PRE_BODY_REUSE_S`` is followed by a fresh check."""
    monkeypatch.setattr(deps, "PRE_BODY_REUSE_S", 0.0)
    key = gateway.store.create_key("alice", "acme")
    content = b"".join(
        [
            f"--{BOUNDARY}\r\n".encode(),
            b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n',
            f"--{BOUNDARY}\r\n".encode(),
            b'Content-Disposition: form-data; name="file"; filename="a.jsonl"\r\n',
            b"Content-Type: application/jsonl\r\n\r\n{}\n\r\n",
            f"--{BOUNDARY}--\r\n".encode(),
        ]
    )
    revoked = False

    async def receive() -> dict[str, Any]:
        nonlocal revoked
        if not revoked:  # the key is revoked while its body is on its way
            revoked = gateway.store.revoke_key(key)
            return {"type": "http.request", "body": content, "more_body": False}
        return {"type": "http.disconnect"}

    body = CountingBody(len(content))
    body.receive = receive  # type: ignore[method-assign]
    answer = await call(gateway, "/v1/files", body, authorization=bearer(key))
    assert revoked
    assert answer.status == 401 and b"revoked" in answer.body


async def test_the_route_reuses_the_caller_found_before_the_body(
    gateway: GatewayHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One key lookup per request, not two: the route takes the caller from the scope."""
    auth = gateway.app.state.gateway.auth
    looked_up: list[str | None] = []
    real = auth.authenticate

    def counting(header: str | None) -> Any:
        looked_up.append(header)
        return real(header)

    monkeypatch.setattr(auth, "authenticate", counting)
    async with gateway.client(gateway.keys["user"]) as http:
        answer = await http.post(
            "/v1/files",
            files={"file": ("a.jsonl", b"{}\n", "application/jsonl")},
            data={"purpose": "batch"},
        )
    assert answer.status_code == 200, answer.text
    assert len(looked_up) == 1


PUBLIC_BODY_ROUTES: frozenset[str] = frozenset({"/api/session"})
"""Routes taking a body from anyone: the dashboard's sign-in (a JSON body of two short
strings, under the body limit; its attempts are rate-limited)."""


def test_every_route_with_a_body_is_authenticated_before_it() -> None:
    """A route added later with a caller dependency the middleware does not know (not in
    ``PRE_BODY_CALLERS``) would read its body before its 401 again: this names it."""
    from fastapi.routing import APIRoute

    from serve_app.ingress.app import api_routes
    from serve_app.ingress.auth_first import _caller_dependencies
    from serve_app.routes.session_only import session_only

    unguarded = [
        f"{sorted(route.methods)} {route.path}"
        for route in api_routes()
        if isinstance(route, APIRoute)
        and route.methods - {"GET", "HEAD", "OPTIONS"}
        and route.path not in PUBLIC_BODY_ROUTES
        and route.endpoint is not session_only  # reads no body; refuses whatever it is sent
        and not _caller_dependencies(route.dependant)
    ]
    assert not unguarded


async def test_a_real_server_answers_401_before_the_body_is_sent_and_closes(
    gateway: GatewayHarness,
) -> None:
    """Over a socket, as ``gateway run`` serves (uvicorn): the client sends only the headers
    of a 150 MiB upload and gets the 401 at once, and the server closes the connection
    rather than waiting for (or draining) the body."""
    import asyncio

    import uvicorn

    config = uvicorn.Config(
        gateway.app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            (
                "POST /v1/files HTTP/1.1\r\nHost: gateway.test\r\n"
                f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
                f"Content-Length: {UPLOAD}\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        try:  # read to EOF: the server closed the connection
            answer = await asyncio.wait_for(reader.read(), timeout=10)
        finally:
            writer.close()
    finally:
        server.should_exit = True
        await serving
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 401")
    assert b"connection: close" in head
    assert b'"invalid_api_key"' in answer
