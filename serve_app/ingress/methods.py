"""``OPTIONS`` on every route, and an ``Allow`` header that names every method of a path.

Starlette answers a method a path lacks with the ``Allow`` of the first route
whose path matched, and FastAPI registers one route per method: ``OPTIONS
/api/dedicated`` said ``Allow: GET`` although the path also takes ``POST``.
This pure ASGI middleware answers ``OPTIONS`` itself (204, ``Allow`` listing the
path's methods, plus ``HEAD`` where ``GET`` exists and ``OPTIONS``) and rewrites
the ``Allow`` of every 405 the same way, so both agree with the OpenAPI
document. A path with no route still gets the router's 404.

Where a literal path and a templated one both match (``/api/dedicated/rates``
and ``/api/dedicated/{endpoint_id}``), the literal route's methods are the
path's methods, as the OpenAPI document lists them.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.routing import Match, Route, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(router: Router, scope: Scope) -> list[str]:
    """The methods the request's path answers to; empty when no route has the path."""
    path = scope.get("path", "")
    matched: list[Route] = []
    for route in router.routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches(scope)
            if match != Match.NONE:
                matched.append(route)
    # The session-only catch-alls (routes/session_only.py) answer any method of their
    # areas; a path the document declares has only its declared methods.
    declared = [route for route in matched if getattr(route, "include_in_schema", True)]
    matched = declared or matched
    literal = [route for route in matched if route.path == path]
    methods = {m for route in (literal or matched) for m in route.methods or ()}
    if not methods:
        return []
    if "GET" in methods:
        methods.add("HEAD")
    methods.add("OPTIONS")
    return sorted(methods, key=lambda m: _ORDER.index(m) if m in _ORDER else len(_ORDER))


class AllowedMethodsMiddleware:
    def __init__(self, app: ASGIApp, router: Router) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("method") == "OPTIONS":
            methods = allowed_methods(self.router, scope)
            if methods:
                headers = [(b"allow", ", ".join(methods).encode()), (b"content-length", b"0")]
                await send({"type": "http.response.start", "status": 204, "headers": headers})
                await send({"type": "http.response.body", "body": b""})
                return

        async def send_with_allow(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                methods = allowed_methods(self.router, scope)
                if methods:
                    MutableHeaders(scope=message)["allow"] = ", ".join(methods)
            await send(message)

        await self.app(scope, receive, send_with_allow)
