"""The one resolver: a model value -> the folder a backend loads.

Every head resolves its engine's ``model`` (and the chat head its LoRA adapters'
``path``) here: ``prepared:`` names are prepared on first use, ``tiny:`` kinds built on
first use, ``packaged:`` folders found inside their wheels (``reference`` says which is
which); a folder or hub id comes back unchanged. Builds are atomic and locked per
folder, so replicas starting together on one host build once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from deployments.local_models import tiny_document_models, tiny_video_model
from deployments.local_models.model_prep import default_models_dir
from deployments.local_models.packaged import packaged_folder
from deployments.local_models.prepared_models import ensure_model
from deployments.local_models.reference import PACKAGED, PREPARED, parse

TINY_BUILDERS: dict[str, Callable[[str, Path], Path]] = {
    **dict.fromkeys(tiny_document_models.TINY_KINDS, tiny_document_models.ensure_tiny),
    **dict.fromkeys(tiny_video_model.TINY_KINDS, tiny_video_model.ensure_tiny_video),
}
"""``tiny:<kind>`` -> the builder of that kind (it takes the kind and the target folder)."""


def resolve_model(value: str, models_dir: Path | None = None) -> str:
    """The folder ``value`` names, prepared or built on first use; other values as they are.

    ``models_dir`` holds one sub-folder per local model (default: ``default_models_dir()``):
    ``<name>`` for ``prepared:<name>``, ``tiny-<kind>`` for ``tiny:<kind>``.
    """
    reference = parse(value)
    if reference is None:
        return value
    if reference.scheme == PACKAGED:
        return packaged_folder(reference.name)
    if reference.scheme == PREPARED:
        target = models_dir / reference.name if models_dir is not None else None
        return str(ensure_model(reference.name, target))
    return str(ensure_tiny(reference.name, models_dir))


def ensure_tiny(kind: str, models_dir: Path | None = None) -> Path:
    """``<models_dir>/tiny-<kind>``, built on first use."""
    if kind not in TINY_BUILDERS:
        raise ValueError(f"unknown tiny model '{kind}'; known: {', '.join(TINY_BUILDERS)}")
    return TINY_BUILDERS[kind](kind, (models_dir or default_models_dir()) / f"tiny-{kind}")
