"""413 ``request_too_large`` before a huge body is read (docs/reference/common.md).

A declared ``Content-Length`` over the limit is refused without reading a
byte; a chunked body is counted as it arrives and refused as soon as it
crosses the limit, so memory stays bounded by the limit, not by the client.

``streamed`` paths (file uploads) are not buffered here at all: their bytes
are counted as the app reads them (the multipart parser spools them to disk),
and when the count crosses the limit the app is told the client left and its
answer is replaced by the 413, so a large upload is never held in memory twice.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.ingress.errors import error_response
from serve_app.protocol.errors import RequestTooLargeError


class BodyLimitMiddleware:
    """Pure ASGI middleware; ``limits`` maps a path prefix to a larger/smaller cap."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        limits: dict[str, int] | None = None,
        streamed: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.limits = dict(limits or {})
        self.streamed = streamed

    def limit_for(self, path: str) -> int:
        for prefix, limit in self.limits.items():
            if path.startswith(prefix):
                return limit
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(limit, scope, receive, send)
            return
        if self.streamed and scope.get("path", "").startswith(self.streamed):
            await self._count_through(limit, scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body.extend(message.get("body", b""))
            more = bool(message.get("more_body", False))
            if len(body) > limit:
                await self._refuse(limit, scope, receive, send)
                return
        await self.app(scope, _replay(bytes(body), receive), send)

    async def _count_through(self, limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app on the live body; past ``limit``, cut it off and answer 413."""
        received = 0
        exceeded = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            if exceeded:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded and not started:
                return  # the app's answer to the cut-off body; the 413 replaces it
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await self._refuse(limit, scope, receive, send)

    async def _refuse(self, limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        err = RequestTooLargeError(
            f"The request body is larger than the limit of {limit} bytes.",
            headers={"Connection": "close"},
        )
        await error_response(err, scope.get("path"))(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
