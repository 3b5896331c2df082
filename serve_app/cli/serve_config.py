"""Reading a Serve config file, for the commands that take one (``run``, ``check``).

Its own module so that ``gateway check`` and ``gateway run`` (which runs the check
first) both read configs the same way without importing each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from serve_app.cli.errors import CommandError
from serve_app.config import REPO_ROOT


def load_serve_config(path: str) -> dict[str, Any]:
    """The config as a dict; a relative path not found here is read from the repository."""
    config_path = Path(path)
    if not config_path.is_absolute() and not config_path.exists():
        config_path = REPO_ROOT / config_path
    if not config_path.exists():
        raise CommandError(f"no such config file: {path}")
    data = yaml.safe_load(config_path.read_text()) or {}
    if not data.get("applications"):
        raise CommandError(f"{path} has no applications")
    return dict(data)
