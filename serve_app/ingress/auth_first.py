"""The caller is known before any byte of the body is read.

FastAPI reads (and, for multipart, spools whole) a request's body before it runs
the route's dependencies, and the body limit and idempotency middlewares read it
before the route too: a 200 MB upload to ``/v1/files`` without a key was read to
its end before its 401. This pure ASGI middleware, outer to every middleware that
reads the body, finds the route a request is for and runs that route's caller
dependencies (``serve_app.requests.deps.PRE_BODY_CALLERS``: the one place that
authenticates) on the headers alone. A missing, malformed, unknown or revoked key
(401) or a key without the route's scope (403) is answered without reading the
body, with ``Connection: close`` so the server drops the unread bytes instead of
draining them; the caller found is left in the scope for the route and for the
replay store (``serve_app.ingress.idempotency`` keys answers by it).

Requests without a body method (GET, HEAD, OPTIONS), paths no route answers
(the router's 404/405 follows) and routes without a caller dependency pass through
untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.routing import Match, Router
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.auth.principal import Principal
from serve_app.ingress.errors import database_unreachable_error, error_response
from serve_app.protocol.errors import GatewayError
from serve_app.requests.deps import PRE_BODY_CALLERS
from serve_app.storage.db import UNREACHABLE_ERRORS

CallerDependency = Callable[[Request], Awaitable[Principal]]

_BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_MAX_CACHED_PATHS = 4096


class AuthFirstMiddleware:
    """Runs the route's caller dependencies before the body; outermost of the body readers."""

    def __init__(self, app: ASGIApp, router: Router) -> None:
        self.app = app
        self.router = router
        self._by_path: dict[tuple[str, str], tuple[CallerDependency, ...]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in _BODYLESS_METHODS:
            await self.app(scope, receive, send)
            return
        callers = self.callers(scope)
        if callers:
            request = Request(scope)  # no receive: reading its body would raise
            try:
                for caller in callers:
                    await caller(request)
            except GatewayError as err:
                await _refuse(err, scope, receive, send)
                return
            except UNREACHABLE_ERRORS:
                await _refuse(database_unreachable_error(), scope, receive, send)
                return
        await self.app(scope, receive, send)

    def callers(self, scope: Scope) -> tuple[CallerDependency, ...]:
        """The caller dependencies of the route the request is for (cached per path)."""
        cache_key = (str(scope.get("method", "")), str(scope.get("path", "")))
        found = self._by_path.get(cache_key)
        if found is None:
            found = ()
            for route in self.router.routes:
                if isinstance(route, APIRoute) and route.matches(scope)[0] == Match.FULL:
                    found = tuple(_caller_dependencies(route.dependant))
                    break
            if len(self._by_path) >= _MAX_CACHED_PATHS:
                self._by_path.clear()  # templated paths (ids) must not grow it unbounded
            self._by_path[cache_key] = found
        return found


def _caller_dependencies(dependant: Dependant) -> list[CallerDependency]:
    """The ``PRE_BODY_CALLERS`` among a route's dependencies, depth first, once each."""
    found: list[CallerDependency] = []
    for sub in dependant.dependencies:
        call = sub.call
        if any(call is known for known in PRE_BODY_CALLERS) and call not in found:
            found.append(call)  # type: ignore[arg-type]
        found.extend(c for c in _caller_dependencies(sub) if c not in found)
    return found


async def _refuse(err: GatewayError, scope: Scope, receive: Receive, send: Send) -> None:
    err.headers.setdefault("Connection", "close")  # the body was never read
    await error_response(err, str(scope.get("path", "")))(scope, receive, send)
