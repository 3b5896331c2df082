"""``x-service-replica``: which gateway replica answered, on every response.

Several gateway replicas sit behind Serve's proxy in production, and what must hold
across them (limits, revocations, batch claims) can only be checked, by an operator
or by tests/production, when each answer says which replica gave it. The value is
Serve's random replica id (8 characters): it names no host, process or address, so a
tenant learns nothing from it but that two answers came from different replicas.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REPLICA_HEADER = "x-service-replica"


class ReplicaHeaderMiddleware:
    """Adds ``x-service-replica: <id>`` to every HTTP response (errors and streams too)."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app = app
        self._header = (REPLICA_HEADER.encode(), replica.encode("latin-1"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self._header]}
            await send(message)

        await self.app(scope, receive, tagged)
