"""The ``gateway`` command line (console script ``gateway = serve_app.cli:main``).

Each module named in ``COMMAND_MODULES`` defines ``register(subparsers)``,
which adds its top-level commands to the ``gateway`` parser. Every leaf
command sets ``handler`` (a ``Handler``) through ``parser.set_defaults``;
``main`` builds the settings once and calls it. Adding a command family is one
new module plus one line in ``COMMAND_MODULES``.

Failures the user can act on (``CommandError``, any ``GatewayError``, a
database error) print ``error: ...`` on stderr and exit 1 without a
traceback; argparse usage errors keep argparse's exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from serve_app.cli.errors import CommandError
from serve_app.protocol.errors import GatewayError
from serve_app.settings import GatewaySettings

# ---- Registered command modules: each must define register(subparsers). ----
COMMAND_MODULES: tuple[str, ...] = (
    "serve_app.cli.accounts",
    "serve_app.cli.check",
    "serve_app.cli.search",
    "serve_app.cli.serve",
    "serve_app.cli.usage",
)

Handler = Callable[[argparse.Namespace, GatewaySettings], int]
"""A leaf command: parsed arguments and settings in, exit status out."""

__all__ = ["COMMAND_MODULES", "CommandError", "Handler", "build_parser", "main"]

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway",
        description="Operate the inference gateway: accounts, API keys and the database.",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log progress to stderr (DEBUG level)"
    )
    subparsers = parser.add_subparsers(title="commands", dest="command", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def _exit_status(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def main(argv: Sequence[str] | None = None, *, settings: GatewaySettings | None = None) -> int:
    """Run one command; ``settings`` defaults to the environment (``GATEWAY_*``)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed by argparse
        return _exit_status(exc)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    handler: Handler = args.handler
    try:
        return handler(args, settings if settings is not None else GatewaySettings())
    except (CommandError, GatewayError) as exc:
        print(f"error: {exc}", file=sys.stderr)
    except ValidationError as exc:
        print(f"error: invalid GATEWAY_* settings:\n{exc}", file=sys.stderr)
    except SQLAlchemyError as exc:
        logger.debug("database error", exc_info=True)
        cause = getattr(exc, "orig", None) or exc  # the driver's message is the useful part
        reason = (str(cause).splitlines() or [type(cause).__name__])[0]
        print(f"error: database failure: {reason}", file=sys.stderr)
    return 1
