"""Resolving an engine backend name: a registered builder, or ``module:Class``.

Every head kind (text, speech, transcription, detect, parse) keeps its own
registry of named builders; the way a name is looked up, and the
``module:Class`` escape hatch, are the same for all of them and live here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def resolve_backend(
    backend: str,
    base: type,
    registry: Mapping[str, Callable[..., Any]],
    label: str | None = None,
) -> Callable[..., Any]:
    """The builder ``backend`` names in ``registry``, or the ``base`` subclass it imports.

    ``module:Class`` is how a Serve config injects an engine that lives outside
    this package (a test's scripted engine on a real Ray cluster, a custom
    backend) without the head knowing about it. The class takes the config dict.
    """
    builder = registry.get(backend)
    if builder is not None:
        return builder
    if ":" not in backend:
        known = ", ".join(sorted(registry))
        raise ValueError(
            f"Unknown {label or base.__name__} backend '{backend}'; known: {known}, "
            "or 'module:Class'."
        )
    module_name, _, attr = backend.partition(":")
    cls = getattr(importlib.import_module(module_name), attr, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"'{backend}' is not a {base.__name__} subclass.")
    engine_cls: Callable[..., Any] = cls
    return engine_cls
