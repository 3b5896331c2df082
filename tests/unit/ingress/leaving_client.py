"""An ASGI client that goes away mid-answer, as a real HTTP client does when aborted.

``httpx``'s ASGI transport reads a body to its end, so it cannot leave early.
This driver plays the server side of a disconnect instead: after ``chunks``
body messages it reports ``http.disconnect`` to the app and fails further
sends, under either ASGI HTTP spec version (2.3: the send fails; 2.4: the app
sees ``ClientDisconnect``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any


async def stream_then_leave(
    app: Any,
    key: str,
    body: dict[str, Any],
    chunks: int,
    spec: str = "2.4",
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
) -> list[bytes]:
    """POST ``body`` to ``path``; return the body messages received before leaving."""
    data = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"gateway.test"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("gateway.test", 80),
    }
    gone = asyncio.Event()
    sent_body = False
    received: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": data, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] != "http.response.body" or not message.get("body"):
            return
        if gone.is_set():
            raise OSError("client gone")
        received.append(message["body"])
        if len(received) >= chunks:
            gone.set()
            await asyncio.sleep(0.01)  # let a disconnect listener act

    with contextlib.suppress(Exception):  # ClientDisconnect under ASGI 2.4
        await app(scope, receive, send)
    return received


def sse_payloads(raw: bytes | str) -> list[Any]:
    """The JSON objects of an SSE body (named events included), without ``[DONE]``."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    out = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[len("data: ") :]))
    return out
