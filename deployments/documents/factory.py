"""Build detect and parse engines from a backend name and a plain config dict.

The document heads receive their engine from here, as the audio heads do from
``deployments.audio.factory``: a catalog entry's ``engine.backend`` picks the implementation
(``deployments.registry`` names them: ``rapid-layout``, ``table-transformer``,
``rapidocr``, ``rapid-table``, ``vision-encoder-decoder``, ``pix2struct``,
``got-ocr-2``), tests register scripted backends or name a ``module:Class``. Engine
modules import their runtime lazily, so the gateway never imports onnxruntime or torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deployments import registry
from deployments.documents.base import DetectEngine, ParseEngine

DetectBuilder = Callable[[dict[str, Any]], DetectEngine]
ParseBuilder = Callable[[dict[str, Any]], ParseEngine]


def register_detect_backend(name: str, builder: DetectBuilder) -> None:
    registry.register("detect", name, builder)


def register_parse_backend(name: str, builder: ParseBuilder) -> None:
    registry.register("parse", name, builder)


def build_detect_engine(backend: str, config: dict[str, Any]) -> DetectEngine:
    """Construct (not start) the detect engine ``backend`` names."""
    engine: DetectEngine = registry.build("detect", backend, DetectEngine, config)
    return engine


def build_parse_engine(backend: str, config: dict[str, Any]) -> ParseEngine:
    """Construct (not start) the parse engine ``backend`` names."""
    engine: ParseEngine = registry.build("parse", backend, ParseEngine, config)
    return engine
