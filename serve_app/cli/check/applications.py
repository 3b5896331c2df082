"""The config's gateway applications: their args validate, and production has what it needs.

Each application that runs ``serve_app.builders:build_gateway_app`` has its args read
as ``GatewayAppArgs`` (the catalog included), each catalog entry's engine checked
(``backends.check_model``), and a production application its environment: the
settings production refuses to start without, every external model's upstream key, and
the catalog's test engines and random-weight ``tiny:`` models. A console sign-in provider
(``dashboard.oidc``) is checked in every mode (``serve_app.cli.check.oidc``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from serve_app.cli.check.backends import check_model
from serve_app.cli.check.memory import check_memory, memory_summary
from serve_app.cli.check.oidc import check_oidc
from serve_app.cli.check.problems import Problem
from serve_app.composition import catalog_stand_ins
from serve_app.config import GatewayAppArgs
from serve_app.settings import GatewaySettings, production_refusals

GATEWAY_BUILDER_PREFIX = "serve_app.builders"


def check_applications(
    serve_config: dict[str, Any], settings: GatewaySettings, *, hub_allowed: bool
) -> list[Problem]:
    """Every problem of the config's gateway applications (not of the services they use)."""
    problems: list[Problem] = []
    apps = [
        app
        for app in serve_config.get("applications") or []
        if str(app.get("import_path", "")).startswith(GATEWAY_BUILDER_PREFIX)
    ]
    if not apps:
        problems.append(
            Problem(
                "config",
                "no application uses serve_app.builders:build_gateway_app",
                "set import_path: serve_app.builders:build_gateway_app",
            )
        )
    production = False
    for app in apps:
        config = _app_args(app, problems)
        if config is None:
            continue
        production = production or config.deployment_mode == "production"
        for model in config.catalog:
            problems.extend(check_model(model, settings, hub_allowed=hub_allowed))
        problems.extend(check_memory(config.catalog, settings.resolved_memory_budget_gib()))
        problems.extend(check_oidc(config.dashboard.oidc))
        if config.deployment_mode == "production":  # locally `gateway run` mints the loopback key
            problems.extend(_external_keys(config))
            problems.extend(_stand_ins(config))
    if production:
        problems.extend(
            Problem("environment", refusal, "export it in the env file (docs/deployment.md)")
            for refusal in production_refusals(settings)
        )
    return problems


def _app_args(app: dict[str, Any], problems: list[Problem]) -> GatewayAppArgs | None:
    """The application's args, or None with why they do not validate added to ``problems``."""
    subject = f"application {app.get('name', 'default')}"
    try:
        return GatewayAppArgs.model_validate(app.get("args") or {})
    except ValidationError as exc:
        problems.extend(_args_problems(subject, exc))
    except OSError as exc:  # a catalog file that does not exist
        problems.append(Problem(subject, f"cannot read a catalog file: {exc}", "fix catalog_files"))
    return None


def _args_problems(subject: str, exc: ValidationError) -> Iterator[Problem]:
    for err in exc.errors():
        yield Problem(
            subject,
            f"args.{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}",
            "correct the value (fields: serve_app/config.py, catalog entries: "
            "serve_app/catalog/config.py)",
        )


def _stand_ins(config: GatewayAppArgs) -> list[Problem]:
    """Test engines and random-weight models: production refuses to start with them."""
    return [
        Problem(
            f"model {model_id}",
            f"production refuses it: {why}",
            "serve a registered backend with real weights, or drop the entry "
            "(docs/deployment.md, 'Refusals')",
        )
        for model_id, why in catalog_stand_ins(config.catalog)
    ]


def _external_keys(config: GatewayAppArgs) -> list[Problem]:
    """External models whose upstream key is not in this environment: every call would fail."""
    return [
        Problem(
            f"model {model.id}",
            f"{model.external.api_key_env} is unset: calls to this external model would fail",
            "export the provider's key in the env file",
        )
        for model in config.catalog
        if model.external is not None and not os.environ.get(model.external.api_key_env)
    ]


def memory_lines(serve_config: dict[str, Any], settings: GatewaySettings) -> list[str]:
    """What each gateway application's catalog needs against the memory budget."""
    lines: list[str] = []
    for app in serve_config.get("applications") or []:
        if not str(app.get("import_path", "")).startswith(GATEWAY_BUILDER_PREFIX):
            continue
        config = _app_args(app, [])
        if config is not None:
            budget = settings.resolved_memory_budget_gib()
            lines.extend(memory_summary(config.catalog, budget))
    return lines
