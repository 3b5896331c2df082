"""Build a ``TextEngine`` from a backend name and a plain config dict.

Heads receive their engine from here, never construct one, so a Serve config
(``backend: vllm`` + its settings) picks the implementation and tests can add
their own backends by name with ``register_text_backend`` (the scripted engine
in ``tests/fakes`` does) instead of monkeypatching the head.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deployments.engines.backends import resolve_backend
from deployments.engines.base import TextEngine
from deployments.engines.model_prep import resolve_model_reference

TextEngineBuilder = Callable[[dict[str, Any]], TextEngine]


def _build_vllm(config: dict[str, Any]) -> TextEngine:
    """``backend: vllm``: validate the dict as ``VLLMEngineConfig``, prepare local models."""
    from deployments.engines.vllm_config import PREPARED_PREFIX, VLLMEngineConfig
    from deployments.engines.vllm_engine import VLLMEngine

    parsed = VLLMEngineConfig.model_validate(config)
    if parsed.model.startswith(PREPARED_PREFIX):
        served = parsed.served_model_name or parsed.model.removeprefix(PREPARED_PREFIX)
        parsed = parsed.model_copy(
            update={"model": resolve_model_reference(parsed.model), "served_model_name": served}
        )
    return VLLMEngine(parsed)


TEXT_BACKENDS: dict[str, TextEngineBuilder] = {"vllm": _build_vllm}
"""Backend name -> builder. Tests add entries through ``register_text_backend``."""


def register_text_backend(name: str, builder: TextEngineBuilder) -> None:
    """Make ``build_text_engine(name, ...)`` use ``builder``; replaces an existing entry."""
    TEXT_BACKENDS[name] = builder


def build_text_engine(backend: str, config: dict[str, Any]) -> TextEngine:
    """Construct (not start) the engine ``backend`` names; ``config`` is its settings dict.

    ``prepared:<name>`` model values are converted here, once per host, so the
    head's ``start`` only loads a ready folder.
    """
    builder = resolve_backend(backend, TextEngine, TEXT_BACKENDS, label="text engine")
    return builder(dict(config))
