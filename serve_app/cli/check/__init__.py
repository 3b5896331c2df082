"""``gateway check --config FILE``: will this Serve config start, and start right?

A config that validates can still fail minutes into ``serve deploy``: a head whose
backend library is not installed crash-loops on its GPU node, an engine argument the
installed vLLM does not know fails at engine start, a hub id on an offline machine
hangs in a download, and a production gateway on the one-machine defaults starts
without complaint. This command finds those before anything starts, without loading a
model: it imports each backend's runtime, validates each engine config with the
backend's own pydantic class and each vLLM head's arguments against the installed
vLLM's ``AsyncEngineArgs``, resolves every model source, and connects to the
database, Redis and the object store, and weighs the catalog's heads against the memory
budget. One line per problem, each with its fix; exit status 1 when there is any.
``gateway run`` runs it before Ray starts.

One module per thing checked: ``applications`` (each gateway application's args,
and what production needs from the environment), ``backends`` (one catalog entry's
engine: runtime imports, engine config), ``vllm_args`` (a vLLM head's arguments
against the installed vLLM), ``sources`` (model references), ``services`` (the
database, Redis, the object store) and ``memory`` (the heads against the memory
budget). ``problems`` holds what they report.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from serve_app.cli.check.applications import check_applications, memory_lines
from serve_app.cli.check.backends import check_model
from serve_app.cli.check.problems import Problem
from serve_app.cli.check.services import check_services
from serve_app.cli.serve_config import load_serve_config
from serve_app.settings import GatewaySettings

__all__ = ["Problem", "check_model", "hub_access_allowed", "register", "report", "run_checks"]

_SubParsers = Any


def register(subparsers: _SubParsers) -> None:
    check = subparsers.add_parser(
        "check",
        help="check that a Serve config can start here (backends, models, services)",
        description="Import every engine backend the config's catalog names, validate engine "
        "settings (vLLM arguments against the installed vLLM), resolve every model source, "
        "and reach the database, Redis and the object store. Prints one line per problem "
        "with its fix; exit status 1 when there is any. Starts no engine.",
    )
    check.add_argument("--config", default="configs/local.yaml", help="Serve config YAML")
    check.add_argument(
        "--offline",
        action="store_true",
        help="treat hub model ids as unreachable unless cached (default: offline when "
        "HF_HUB_OFFLINE is set)",
    )
    check.set_defaults(handler=_check)


def _check(args: argparse.Namespace, settings: GatewaySettings) -> int:
    serve_config = load_serve_config(args.config)
    problems = run_checks(serve_config, settings, hub_allowed=hub_access_allowed(args.offline))
    for line in memory_lines(serve_config, settings):  # what the catalog needs, not a problem
        print(f"gateway check: {line}", file=sys.stderr)
    return report(problems, args.config)


def report(problems: list[Problem], config_name: str) -> int:
    """Print the problems (stdout, one per line) and a summary (stderr); the exit status."""
    for problem in problems:
        print(problem.line())
    if problems:
        print(f"gateway check: {len(problems)} problem(s) in {config_name}", file=sys.stderr)
        return 1
    print(f"gateway check: {config_name} OK", file=sys.stderr)
    return 0


def hub_access_allowed(offline: bool = False) -> bool:
    """Hub ids count as reachable unless ``--offline`` or ``HF_HUB_OFFLINE`` says otherwise."""
    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return not offline and flag not in ("1", "true", "yes", "on")


def run_checks(
    serve_config: dict[str, Any], settings: GatewaySettings, *, hub_allowed: bool
) -> list[Problem]:
    """Every problem of the config's gateway applications and of the services they use."""
    problems = check_applications(serve_config, settings, hub_allowed=hub_allowed)
    return problems + check_services(settings)
