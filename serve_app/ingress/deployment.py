"""The gateway ingress as a Ray Serve deployment.

Each replica has the composition root (``serve_app.composition.build_replica``)
build its own ``GatewayState`` (catalog, auth, head clients) from the validated
args, then hands Serve the FastAPI app through ``__serve_build_asgi_app__`` so
routes never reach for globals.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from ray import serve

from serve_app.composition import build_replica, close_replica
from serve_app.ingress.app import create_app
from serve_app.ingress.direct_port import wait_for_direct_port
from serve_app.ingress.replica_header import ReplicaHeaderMiddleware

logger = logging.getLogger(__name__)


@serve.deployment(name="Gateway")
@serve.ingress()
class Gateway:
    """Stateless FastAPI ingress; scale it with ``ingress.num_replicas``."""

    async def __init__(  # type: ignore[misc]  # Serve awaits async constructors
        self, args: dict[str, Any], heads: dict[str, Any], tool_runner: Any = None
    ) -> None:
        context = serve.get_replica_context()
        config, state = await build_replica(args, heads, tool_runner, context.app_name)
        self._state = state
        self._app = create_app(state, config.max_body_bytes)
        # Outermost: every answer names its replica, refusals before the body included.
        self._app.add_middleware(ReplicaHeaderMiddleware, replica=context.replica_id.unique_id)
        await wait_for_direct_port()  # Serve binds --port right after this returns
        logger.info("gateway replica ready with %d models", len(state.catalog))

    def __serve_build_asgi_app__(self) -> FastAPI:
        return self._app

    async def __del__(self) -> None:
        """Graceful stop: commit spooled usage, close counter connections."""
        state = getattr(self, "_state", None)
        if state is not None:
            await close_replica(state)
