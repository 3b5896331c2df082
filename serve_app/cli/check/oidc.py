"""The dashboard's OpenID Connect provider: its secret is in the environment and its
discovery document answers for the configured issuer (docs/deployment.md, "OpenID
Connect sign-in"). Production's https rule is the config's own (``GatewayAppArgs``):
an http issuer there fails validation, so the gateway refuses it even without a check.
"""

from __future__ import annotations

import os

import httpx

from serve_app.auth.oidc_config import OidcOptions
from serve_app.cli.check.problems import Problem

SUBJECT = "dashboard.oidc"
DISCOVERY_TIMEOUT_S = 5.0


def check_oidc(options: OidcOptions | None) -> list[Problem]:
    if options is None:
        return []
    problems = []
    if not os.environ.get(options.client_secret_env):
        problems.append(
            Problem(
                SUBJECT,
                f"{options.client_secret_env} (the client secret) is unset: the gateway "
                "would not start",
                f"export {options.client_secret_env} in the env file (docs/deployment.md)",
            )
        )
    problem = _discovery_problem(options)
    if problem is not None:
        problems.append(problem)
    return problems


def _discovery_problem(options: OidcOptions) -> Problem | None:
    url = options.resolved_discovery_url()
    try:
        answer = httpx.get(url, timeout=DISCOVERY_TIMEOUT_S, headers={"Accept": "application/json"})
        answer.raise_for_status()
        issuer = answer.json().get("issuer")
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return Problem(
            SUBJECT,
            f"discovery at {url} failed: {exc}",
            "check issuer (or discovery_url) and that this machine reaches the provider",
        )
    if issuer != options.issuer:
        return Problem(
            SUBJECT,
            f"the provider's discovery names issuer {issuer!r}, not {options.issuer!r}",
            "set issuer to exactly the provider's issuer (ID tokens are checked against it)",
        )
    return None
