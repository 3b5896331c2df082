"""Logging inside Ray Serve replicas: our module loggers, at INFO, on the replica's stderr.

Ray Serve configures only its own ``ray.serve`` logger in a replica; the root
logger of a Ray worker has no handler below WARNING, so a head's "model ready
in 12 s" or a video job's progress vanished. Every replica constructor calls
``configure_replica_logging`` first: records of the ``serve_app`` and
``deployments`` loggers then go to the worker's stderr, which Ray writes to the
replica's log file (Ray dashboard -> Logs) and, under ``gateway run``, echoes
to the terminal. ``GATEWAY_LOG_LEVEL`` changes the level (default INFO).
"""

from __future__ import annotations

import logging
import os
import sys

OUR_LOGGERS = ("serve_app", "deployments")
_FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"


def configure_replica_logging() -> None:
    """Idempotent: a second call (another deployment in the same worker) adds nothing."""
    level = os.environ.get("GATEWAY_LOG_LEVEL", "INFO").upper()
    for name in OUR_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(getattr(h, "_gateway_replica", False) for h in logger.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(_FORMAT))
            handler._gateway_replica = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
        logger.propagate = False  # the root logger would print a second copy where it has a handler
