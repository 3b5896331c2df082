"""Logging inside Ray Serve replicas: our module loggers and vLLM's, in the replica's log file.

Ray Serve configures only its own ``ray.serve`` logger in a replica (a buffered
handler over the replica's log file, the one the Ray dashboard shows, plus
stderr unless ``RAY_SERVE_LOG_TO_STDERR=0``); the root logger of a Ray worker
has no handler below WARNING, so a head's "model ready in 12 s" or a video
job's progress vanished. Every replica constructor calls
``configure_replica_logging`` first: records of the ``serve_app``,
``deployments`` and ``vllm`` loggers are then handed to the ``ray.serve``
logger's handlers, so they land in the replica's log file with Serve's own
format (component, replica id, request id). Outside a Serve replica (tests,
scripts) they go to stderr. ``GATEWAY_LOG_LEVEL`` changes the level of ours
(default INFO), ``VLLM_LOGGING_LEVEL`` vLLM's.

Serve also writes one access line per request ("CALL embed OK 98.1ms") to the replica's
stderr, which Ray's log monitor reads back and ships through the GCS to the driver's terminal:
about 2 ms of CPU per request in those three processes (bench/RESULTS.md, "2026-11-27
11:05-12:30"), taken from the engines under load. ``configure_replica_logging`` keeps access lines
out of the stderr stream; they stay in the replica's log file and the dashboard.
``GATEWAY_CONSOLE_ACCESS_LOG=1`` keeps them on the terminal too.

vLLM is told not to apply its own ``logging.config.dictConfig`` in a replica
(``deployments/vllm_start.py``): ``dictConfig`` closes every handler of
the process, Serve's file handler included, which left the replica log at one
line and made a restarted ServeController stop every chat head.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from typing import Any

OUR_LOGGERS = ("serve_app", "deployments")
ENGINE_LOGGERS = ("vllm",)
SERVE_LOGGER = "ray.serve"
_FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"


class ToServeLogger(logging.Handler):
    """Hands a record to the ``ray.serve`` logger's handlers (the replica's log file).

    Looked up at each record, not at set-up: Serve replaces its handlers when a
    replica's logging config changes.
    """

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(SERVE_LOGGER).handle(record)


def _in_serve_replica() -> bool:
    """Serve has set up its replica logger here (a file handler behind a MemoryHandler)."""
    return any(
        isinstance(h, logging.handlers.MemoryHandler)
        for h in logging.getLogger(SERVE_LOGGER).handlers
    )


def _handler() -> logging.Handler:
    if _in_serve_replica():
        return ToServeLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    return handler


def _not_an_access_line(record: logging.LogRecord) -> bool:
    return not getattr(record, "serve_access_log", False)


def _quiet_console_access_lines() -> None:
    """Serve's stderr handler drops its access lines (module docstring); its file keeps them.

    Serve makes new handlers when a replica's logging config is changed in place; the
    access lines then reach the terminal again until the replica restarts.
    """
    if os.environ.get("GATEWAY_CONSOLE_ACCESS_LOG", "") in {"1", "true", "yes"}:
        return
    for handler in logging.getLogger(SERVE_LOGGER).handlers:
        plain_stream = isinstance(handler, logging.StreamHandler) and not isinstance(
            handler, logging.FileHandler
        )
        if plain_stream and _not_an_access_line not in handler.filters:
            handler.addFilter(_not_an_access_line)


def vllm_logging_config() -> Any:
    """The ``LoggingConfig`` every vLLM engine in a replica starts with: no ``dictConfig``.

    Chat, pooling and speech engines all pass it; a ``dictConfig`` in the replica's process
    would close Serve's log handlers (module docstring).
    """
    from vllm.config.logging import LoggingConfig

    return LoggingConfig(configure_logging=False)


def configure_replica_logging() -> None:
    """Idempotent: a second call (another deployment in the same worker) adds nothing."""
    levels = {name: os.environ.get("GATEWAY_LOG_LEVEL", "INFO") for name in OUR_LOGGERS}
    levels.update({name: os.environ.get("VLLM_LOGGING_LEVEL", "INFO") for name in ENGINE_LOGGERS})
    for name, level in levels.items():
        logger = logging.getLogger(name)
        logger.setLevel(level.upper())
        if not any(getattr(h, "_gateway_replica", False) for h in logger.handlers):
            handler = _handler()
            handler._gateway_replica = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
        logger.propagate = False  # the root logger would print a second copy where it has a handler
    _quiet_console_access_lines()
