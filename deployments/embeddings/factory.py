"""Build a ``PoolingEngine`` from a backend name and a plain config dict.

The pooling head receives its engine from here, so a Serve config (``backend: vllm``
and its settings) picks the implementation and tests add their own backends by
name (``register_pooling_backend``) or as ``module:Class`` instead of patching.
Which names exist, their config classes and runtimes: ``deployments.registry``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deployments import registry
from deployments.embeddings.base import PoolingEngine

PoolingEngineBuilder = Callable[[dict[str, Any], str], PoolingEngine]


def register_pooling_backend(name: str, builder: PoolingEngineBuilder) -> None:
    registry.register("pooling", name, builder)


def build_pooling_engine(backend: str, config: dict[str, Any], served_name: str) -> PoolingEngine:
    """Construct (not start) the engine ``backend`` names; ``served_name``: the catalog id
    (a ``module:Class`` engine takes the config dict alone)."""
    engine: PoolingEngine = registry.build("pooling", backend, PoolingEngine, config, served_name)
    return engine
