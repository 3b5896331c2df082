"""Serve's own view of its applications, read from the gateway: one read, one vocabulary.

Head readiness (``serve_app.inference.readiness``) and the dedicated reconciler
(``serve_app.dedicated.control.ray_backend``) both need the ServeController's
instance details. They read the plain dict the controller sends, not
``serve.status()``: that parses it into Serve's pydantic schema first, whose
deployment configs cloudpickle their request router class on every read (70% of an
idle gateway replica's Python time, bench/RESULTS.md, "Embeddings").
"""

from __future__ import annotations

from enum import Enum
from typing import Any


def serve_details() -> dict[str, Any] | None:
    """The ServeController's instance details; None while no controller runs."""
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    return client.get_serve_details() if client is not None else None


def serve_name(value: object) -> str:
    """A status or state as Serve names it (the details hold its enums, or their values)."""
    return str(value.value) if isinstance(value, Enum) else str(value or "")
