"""Build detect and parse engines from a backend name and a plain config dict.

The document heads receive their engine from here, as the audio heads do from
``audio_factory``: a catalog entry's ``engine.backend`` picks the
implementation (``rapid-layout``, ``table-transformer``, ``rapidocr``,
``rapid-table``, ``vision-encoder-decoder``, ``pix2struct``, ``got-ocr-2``),
tests register scripted backends or name a ``module:Class``. Builders import
their runtime lazily, so the gateway never imports onnxruntime or torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deployments.engines.backends import resolve_backend
from deployments.engines.document_base import DetectEngine, ParseEngine

DetectBuilder = Callable[[dict[str, Any]], DetectEngine]
ParseBuilder = Callable[[dict[str, Any]], ParseEngine]


def _rapid_layout(config: dict[str, Any]) -> DetectEngine:
    from deployments.engines.rapid_engines import RapidLayoutConfig, RapidLayoutDetectEngine

    return RapidLayoutDetectEngine(RapidLayoutConfig.model_validate(config))


def _rapidocr(config: dict[str, Any]) -> ParseEngine:
    from deployments.engines.rapid_engines import RapidOcrConfig, RapidOcrParseEngine

    return RapidOcrParseEngine(RapidOcrConfig.model_validate(config))


def _rapid_table(config: dict[str, Any]) -> ParseEngine:
    from deployments.engines.rapid_engines import RapidOcrConfig, RapidTableParseEngine

    return RapidTableParseEngine(RapidOcrConfig.model_validate(config))


def _hf(class_name: str) -> Callable[[dict[str, Any]], Any]:
    def build(config: dict[str, Any]) -> Any:
        from deployments.engines import hf_document_engines as hf

        return getattr(hf, class_name)(hf.HfDocumentConfig.model_validate(config))

    return build


DETECT_BACKENDS: dict[str, DetectBuilder] = {
    "rapid-layout": _rapid_layout,
    "table-transformer": _hf("TableTransformerDetectEngine"),
}
PARSE_BACKENDS: dict[str, ParseBuilder] = {
    "rapidocr": _rapidocr,
    "rapid-table": _rapid_table,
    "vision-encoder-decoder": _hf("VisionEncoderDecoderParseEngine"),
    "pix2struct": _hf("Pix2StructParseEngine"),
    "got-ocr-2": _hf("GotOcr2ParseEngine"),
}


def register_detect_backend(name: str, builder: DetectBuilder) -> None:
    DETECT_BACKENDS[name] = builder


def register_parse_backend(name: str, builder: ParseBuilder) -> None:
    PARSE_BACKENDS[name] = builder


def is_known_document_backend(head: str, backend: str) -> bool:
    """Whether ``backend`` can serve a ``detect``/``parse`` model (checked at app build)."""
    registry: dict[str, Any] = DETECT_BACKENDS if head == "detect" else PARSE_BACKENDS
    return backend in registry or ":" in backend


def build_detect_engine(backend: str, config: dict[str, Any]) -> DetectEngine:
    """Construct (not start) the detect engine ``backend`` names."""
    builder = resolve_backend(backend, DetectEngine, DETECT_BACKENDS)
    return builder(dict(config))


def build_parse_engine(backend: str, config: dict[str, Any]) -> ParseEngine:
    """Construct (not start) the parse engine ``backend`` names."""
    builder = resolve_backend(backend, ParseEngine, PARSE_BACKENDS)
    return builder(dict(config))
