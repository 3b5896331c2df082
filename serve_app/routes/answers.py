"""A service's ``Answer`` as the HTTP response: the one place routes build one from it.

A ``Body`` is a plain response with its bytes as they are. A ``FrameStream`` is a
``MeteredStreamingResponse``: a stream response that closes its frames and releases
the request however it ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from serve_app.inference.answers import Answer, Body
from serve_app.inference.streams import aclose_quietly


class MeteredStreamingResponse(StreamingResponse):
    """A stream response that closes its body and releases the request however it ends.

    Starlette leaves the body generator suspended when the client disconnects
    (ASGI 2.4 raises ``ClientDisconnect``; older servers cancel the sender), so
    its ``finally`` would run only whenever the garbage collector finds it, and
    never when the client left before the first byte. Closing it here runs the
    head release, billing and settlement at once; ``release`` then covers a body
    that never started (both steps are idempotent).
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        release: Callable[[], Awaitable[None]],
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self._frames = content
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await aclose_quietly(self._frames)
            await self._release()


def http_response(answer: Answer) -> Response:
    """The response that sends ``answer``: its status, headers and bytes, unchanged."""
    if isinstance(answer, Body):
        return Response(
            answer.content,
            status_code=answer.status_code,
            headers=answer.headers,
            media_type=answer.media_type,
        )
    return MeteredStreamingResponse(
        answer.frames,
        release=answer.release,
        media_type=answer.media_type,
        headers=answer.headers,
    )
