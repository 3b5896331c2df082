"""Adds OpenAI's ``x-ratelimit-*`` headers to every answer the limiter admitted or refused.

Pure ASGI (no ``BaseHTTPMiddleware``): it opens a per-request report before the
app runs and, when the answer's ``http.response.start`` passes, writes the
headers of whatever the limiter recorded into it (``serve_app.limits.headers``).
Admission always happens before the first byte (docs/reference/common.md#limits), so a streamed
answer carries them as well as a JSON one. Headers the answer already has (a 429 sets
its own) are left as they are.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.limits.headers import close_report, open_report, rate_limit_headers


class RateLimitHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        report, token = open_report()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and report.states:
                headers = MutableHeaders(scope=message)
                for name, value in rate_limit_headers(report.states).items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            close_report(token)
