"""Build a ``TextEngine`` from a backend name and a plain config dict.

Heads receive their engine from here, never construct one, so a Serve config
(``backend: vllm`` + its settings) picks the implementation and tests can add
their own backends by name with ``register_text_backend`` instead of monkeypatching
the head. Which names exist, their config classes and runtimes: ``deployments.registry``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deployments import registry
from deployments.chat.base import TextEngine
from deployments.local_models.reference import prepared_name
from deployments.local_models.resolve import resolve_model

if TYPE_CHECKING:
    from deployments.chat.vllm_config import VLLMEngineConfig

TextEngineBuilder = Callable[[dict[str, Any]], TextEngine]


def build_vllm(parsed: VLLMEngineConfig) -> TextEngine:
    """``backend: vllm`` (the registry's builder): prepare a local model, then the engine."""
    from deployments.chat.vllm_engine import VLLMEngine

    if name := prepared_name(parsed.model):
        served = parsed.served_model_name or name
        parsed = parsed.model_copy(
            update={"model": resolve_model(parsed.model), "served_model_name": served}
        )
    return VLLMEngine(parsed)


def register_text_backend(name: str, builder: TextEngineBuilder) -> None:
    """Make ``build_text_engine(name, ...)`` use ``builder``; replaces an existing entry."""
    registry.register("chat", name, builder)


def build_text_engine(backend: str, config: dict[str, Any]) -> TextEngine:
    """Construct (not start) the engine ``backend`` names; ``config`` is its settings dict.

    ``prepared:<name>`` model values are converted here, once per host, so the
    head's ``start`` only loads a ready folder.
    """
    engine: TextEngine = registry.build("chat", backend, TextEngine, config)
    return engine
