"""Where the Ray dashboard is and how to get past its token (issue 47, item 5).

Ray 2.60 turns on token authentication for a new local instance: its dashboard asks a
browser for the token (and its API answers "Unauthorized: Missing authentication
token"). The dashboard takes the token only from an ``Authorization`` header or its own
cookie, set when the token is pasted into its prompt: no link can carry it. Ray reads the
token from ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH``, else
``~/.ray/auth_token`` (written by ``ray.init`` on first start; ``ray get-auth-token``
prints it). This module says which, without importing Ray, for ``gateway run`` and for
``GET /api/admin/ray-dashboard``. It never hands the token itself out over HTTP: the
token lets its holder run code on the cluster.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DASHBOARD_URL_ENV = "GATEWAY_RAY_DASHBOARD_URL"
"""Set by ``gateway run`` for its replicas; an operator sets it for a cluster."""
DEFAULT_URL = "http://127.0.0.1:8265"


@dataclass(frozen=True)
class RayDashboard:
    url: str
    token_hint: str


def token_hint(environ: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """Where Ray's dashboard token is, as a sentence for a person."""
    env = os.environ if environ is None else environ
    if env.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return "No token: Ray's token authentication is off (RAY_AUTH_MODE=disabled)."
    paste = "paste it when the dashboard asks for a token"
    if env.get("RAY_AUTH_TOKEN"):
        return f"The token is the RAY_AUTH_TOKEN environment variable of the gateway; {paste}."
    if env.get("RAY_AUTH_TOKEN_PATH"):
        return f"The token is in the file {env['RAY_AUTH_TOKEN_PATH']}; {paste}."
    path = (home or Path.home()) / ".ray" / "auth_token"
    return (
        f"The token is in the file {path} on the gateway's machine "
        f"(`.venv/bin/ray get-auth-token` prints it); {paste}."
    )


def startup_lines(
    url: str, environ: Mapping[str, str] | None = None, home: Path | None = None
) -> list[str]:
    """What ``gateway run`` prints once Ray is up: the URL, and on its own lines where the
    token is and the one command that prints it (not a tooltip someone must find)."""
    env = os.environ if environ is None else environ
    if env.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return [f"Ray dashboard: {url} (token authentication off: RAY_AUTH_MODE=disabled)"]
    if env.get("RAY_AUTH_TOKEN"):
        where = "the RAY_AUTH_TOKEN environment variable `gateway run` was started with"
    elif env.get("RAY_AUTH_TOKEN_PATH"):
        where = f"the file {env['RAY_AUTH_TOKEN_PATH']}"
    else:
        where = f"the file {(home or Path.home()) / '.ray' / 'auth_token'}"
    return [
        f"Ray dashboard: {url} (Ray 2.60 asks the browser for a token)",
        f"  its token is {where}; print it with: .venv/bin/ray get-auth-token",
        "  paste it into the dashboard's prompt once (Ray keeps it in a cookie for 30 days)",
    ]


def ray_dashboard(environ: Mapping[str, str] | None = None) -> RayDashboard:
    env = os.environ if environ is None else environ
    return RayDashboard(env.get(DASHBOARD_URL_ENV) or DEFAULT_URL, token_hint(env))
