"""The one way a model value names a local model: ``<scheme>:<name>``.

- ``prepared:<name>``: a folder built here from PyPI packages (``prepared_models``
  lists the names: the GGUF conversions of ``model_prep`` and the demos built on them);
- ``tiny:<kind>``: a tiny random-weight model built here (``tiny_document_models``,
  ``tiny_video_model``), for CPU runs and tests of the GPU backends' code paths;
- ``packaged:<distribution>``: a finished folder shipped inside a PyPI wheel
  (``packaged``).

Anything else (a folder, a hub id) is not a reference and is loaded as it is. Parsing
imports nothing, so the gateway and ``gateway check`` read references without loading a
builder; ``resolve`` turns one into a folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scheme = Literal["prepared", "tiny", "packaged"]
PREPARED: Scheme = "prepared"
TINY: Scheme = "tiny"
PACKAGED: Scheme = "packaged"
SCHEMES: tuple[Scheme, ...] = (PREPARED, TINY, PACKAGED)


@dataclass(frozen=True)
class ModelReference:
    """A parsed ``<scheme>:<name>`` model value."""

    scheme: Scheme
    name: str

    def __str__(self) -> str:
        return f"{self.scheme}:{self.name}"


def parse(value: str) -> ModelReference | None:
    """The reference ``value`` spells, or ``None`` for a folder or hub id."""
    scheme, colon, name = value.partition(":")
    if colon and scheme in SCHEMES:
        return ModelReference(scheme, name)
    return None


def prepared_name(value: str) -> str | None:
    """``<name>`` of a ``prepared:<name>`` value; ``None`` for anything else."""
    reference = parse(value)
    return reference.name if reference is not None and reference.scheme == PREPARED else None


def is_tiny(value: str) -> bool:
    """Whether ``value`` is a ``tiny:<kind>`` reference."""
    reference = parse(value)
    return reference is not None and reference.scheme == TINY
