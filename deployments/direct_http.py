"""The answer of a dedicated endpoint's replica to HTTP sent to it directly.

Under direct ingress (``gateway run``'s default) Serve gives every application's
ingress replica an HTTP port, a dedicated endpoint's too. The endpoint is only
ever reached through the gateway (keys, limits, metering), by its alias on
``/v1``, so its head answers a 404 envelope there, never a model call.
"""

from __future__ import annotations

from typing import Any

from serve_app.contract.errors import NotFoundError


def refuse_direct_http() -> Any:
    """A 404 error envelope as a Starlette response."""
    from starlette.responses import JSONResponse

    err = NotFoundError(
        "Dedicated endpoints are served through the gateway's /v1 by their alias "
        "(model: ded/<slug>), not on this port."
    )
    return JSONResponse(err.envelope(), status_code=err.status_code)
