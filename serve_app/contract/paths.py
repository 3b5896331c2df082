"""Where locally prepared models are cached, as both the gateway and its heads find it.

A head replica resolves ``prepared:<name>`` and ``tiny:<kind>`` engine references
itself (``deployments.local_models.model_prep``), from the same ``GATEWAY_*``
environment as the gateway, without importing the gateway's settings. This is
that one lookup; ``serve_app.settings.GatewaySettings`` reads the same variables
(``models_dir``, ``state_dir``) for the gateway and its CLI, and a unit test
holds the two to the same answer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DEFAULT_STATE_DIR = Path.home() / ".local" / "share" / "inference-gateway"
"""``GATEWAY_STATE_DIR`` when unset: the embedded default's SQLite file, objects and models."""

MODELS_DIR_ENV = "GATEWAY_MODELS_DIR"
STATE_DIR_ENV = "GATEWAY_STATE_DIR"


def models_dir_from_environment(environ: Mapping[str, str] | None = None) -> Path:
    """``GATEWAY_MODELS_DIR``, else ``<GATEWAY_STATE_DIR>/models``, else the default's.

    Names match case-insensitively and an empty value counts as set, as
    pydantic-settings reads them for ``GatewaySettings``.
    """
    values = {k.lower(): v for k, v in (os.environ if environ is None else environ).items()}
    models = values.get(MODELS_DIR_ENV.lower())
    if models is not None:
        return Path(models)
    state = values.get(STATE_DIR_ENV.lower())
    return (Path(state) if state is not None else DEFAULT_STATE_DIR) / "models"
