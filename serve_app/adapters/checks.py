"""An uploaded adapter checked against its base model before anything stores or loads it.

docs/reference/adapters.md#validation. The weights' safetensors header is parsed here
(JSON after an 8-byte length; no tensor library touches the upload, and nothing is ever
unpickled): every tensor must be a ``lora_A``/``lora_B`` weight of a decoder layer the
base model has, of a module the base model has, shaped for that module's sizes and the
adapter's rank, its bytes exactly where the header says. ``adapter_config.json`` is
checked (rank and ``lora_alpha`` finite and in range, ``target_modules`` the modules the
weights adapt) and then replaced: the stored config is written here from the checked
facts, so an engine never reads a field a client chose. ``base_model_name_or_path`` is
ignored (the stored config names the base model the adapter was checked against).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from serve_app.contract.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    SUPPORTED_TARGET_MODULES,
    BaseShapes,
    LoraSettings,
)
from serve_app.protocol.errors import InvalidRequestError, RequestTooLargeError

MAX_CONFIG_BYTES = 64 * 1024
MAX_HEADER_BYTES = 1024 * 1024
"""A safetensors header's bound: ~150 bytes a tensor, far more tensors than any model's."""
MAX_TENSORS = 8192
MAX_LORA_ALPHA = 4096.0
DTYPE_BYTES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
_TENSOR = re.compile(
    r"base_model\.model\.model\.layers\.(\d{1,5})\.(self_attn|mlp)\.([a-z_]{1,32})"
    r"\.lora_([AB])\.weight"
)
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn"}
_PARENT |= {"o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def _invalid(message: str, code: str = "invalid_adapter") -> InvalidRequestError:
    return InvalidRequestError(message, code=code, param="file")


@dataclass(frozen=True)
class AdapterFacts:
    """What the checks established; ``files`` holds the config written from them."""

    rank: int
    target_modules: tuple[str, ...]
    files: dict[str, bytes]

    @property
    def bytes(self) -> int:
        return sum(len(data) for data in self.files.values())


@dataclass(frozen=True)
class _Config:
    rank: int
    alpha: float
    rslora: bool
    targets: frozenset[str]


def inspect_adapter(
    files: Mapping[str, bytes], lora: LoraSettings, base: BaseShapes, base_id: str
) -> AdapterFacts:
    """Check the adapter against the head's ``lora`` bounds and the base model's shapes;
    a 400 naming the first problem (413 over the weights' bound). CPU-bound: a thread."""
    weights = files[ADAPTER_WEIGHTS]
    if len(weights) > lora.max_adapter_bytes:
        raise RequestTooLargeError(
            f"The adapter is larger than this model's bound of {lora.max_adapter_bytes} bytes.",
            param="file",
        )
    config = _config(files[ADAPTER_CONFIG], lora)
    modules = _check_weights(weights, base, config.rank)
    _check_targets(config.targets, modules, base)
    written = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_id,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "use_rslora": config.rslora,
        "target_modules": sorted(modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "use_dora": False,
    }
    return AdapterFacts(
        rank=config.rank,
        target_modules=tuple(sorted(modules)),
        files={ADAPTER_CONFIG: json.dumps(written).encode(), ADAPTER_WEIGHTS: weights},
    )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _json(raw: bytes, what: str) -> Any:
    """JSON without NaN/Infinity (Python's reader accepts them) or deep nesting."""
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _invalid(f"{what} is not valid JSON: {str(exc)[:200]}") from exc


def _config(raw: bytes, lora: LoraSettings) -> _Config:
    if len(raw) > MAX_CONFIG_BYTES:
        raise _invalid(f"{ADAPTER_CONFIG} is larger than {MAX_CONFIG_BYTES} bytes.")
    config = _json(raw, ADAPTER_CONFIG)
    if not isinstance(config, dict):
        raise _invalid(f"{ADAPTER_CONFIG} must be a JSON object.")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise _invalid(f"Only LoRA adapters are served (peft_type {config.get('peft_type')}).")
    _unsupported_features(config)
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise _invalid(f"{ADAPTER_CONFIG} needs a positive integer rank 'r'.")
    if rank > lora.max_lora_rank:
        raise _invalid(
            f"The adapter's rank {rank} exceeds this model's max_lora_rank {lora.max_lora_rank}.",
            code="adapter_rank_too_large",
        )
    alpha = config.get("lora_alpha", 8)
    if (
        not isinstance(alpha, int | float)
        or isinstance(alpha, bool)
        or not math.isfinite(alpha)
        or not 0 < alpha <= MAX_LORA_ALPHA
    ):
        raise _invalid(f"lora_alpha must be a finite number in (0, {MAX_LORA_ALPHA:g}].")
    rslora = config.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise _invalid("use_rslora must be true or false.")
    targets = config.get("target_modules")
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise _invalid("target_modules must list the adapted modules' names.")
    return _Config(rank=rank, alpha=float(alpha), rslora=rslora, targets=frozenset(targets))


def _unsupported_features(config: dict[str, Any]) -> None:
    refused = {
        "use_dora": "DoRA adapters are not served.",
        "modules_to_save": "Adapters with modules_to_save (fully trained layers) are not served.",
        "rank_pattern": "Per-module ranks (rank_pattern) are not served.",
        "alpha_pattern": "Per-module alphas (alpha_pattern) are not served.",
        "fan_in_fan_out": "fan_in_fan_out adapters are not served.",
        "lora_bias": "Adapters with LoRA biases are not served.",
    }
    for field, message in refused.items():
        if config.get(field):
            raise _invalid(message, code="unsupported_adapter")
    if config.get("bias", "none") != "none":
        raise _invalid("Adapters that train biases are not served.", code="unsupported_adapter")


def _header(data: bytes) -> tuple[dict[str, Any], int]:
    """The safetensors header and the length of the data after it."""
    not_safetensors = _invalid(f"{ADAPTER_WEIGHTS} is not a safetensors file.")
    if len(data) < 8:
        raise not_safetensors
    (length,) = struct.unpack("<Q", data[:8])
    if length > MAX_HEADER_BYTES:
        raise _invalid(f"{ADAPTER_WEIGHTS}' header is larger than {MAX_HEADER_BYTES} bytes.")
    if length > len(data) - 8:
        raise not_safetensors
    header = _json(data[8 : 8 + length], ADAPTER_WEIGHTS)
    if not isinstance(header, dict):
        raise not_safetensors
    if len(header) > MAX_TENSORS + 1:
        raise _invalid(f"{ADAPTER_WEIGHTS} holds more than {MAX_TENSORS} tensors.")
    return header, len(data) - 8 - length


def _check_weights(data: bytes, base: BaseShapes, rank: int) -> set[str]:
    """The modules the weights adapt, every tensor checked against ``base`` and ``rank``."""
    header, body = _header(data)
    pairs: dict[tuple[int, str], set[str]] = {}
    spans: list[tuple[int, int]] = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise _invalid(f"{ADAPTER_WEIGHTS}' __metadata__ is malformed.")
            continue
        layer, module, kind = _tensor_name(name, base)
        spans.append(_check_tensor(name, info, base, module, kind, rank))
        pairs.setdefault((layer, module), set()).add(kind)
    if not pairs:
        raise _invalid(f"{ADAPTER_WEIGHTS} holds no LoRA weights.")
    unpaired = sorted(f"layers.{la}.{m}" for (la, m), kinds in pairs.items() if len(kinds) != 2)
    if unpaired:
        raise _invalid(f"{', '.join(unpaired[:5])} lack lora_A or lora_B.")
    _check_spans(spans, body)
    return {module for _, module in pairs}


def _tensor_name(name: str, base: BaseShapes) -> tuple[int, str, str]:
    match = _TENSOR.fullmatch(name)
    shown = name[:120]
    if match is None:
        raise _invalid(
            f"Tensor '{shown}' is not a LoRA weight of a decoder layer "
            "(base_model.model.model.layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight)."
        )
    layer, parent, module, kind = int(match[1]), match[2], match[3], match[4]
    if module not in SUPPORTED_TARGET_MODULES or base.features(module) is None:
        raise _invalid(
            f"Tensor '{shown}' adapts '{module}', which this base model does not offer to "
            f"adapters; it offers {', '.join(m for m, _, _ in base.modules)}.",
            code="unsupported_target_modules",
        )
    if _PARENT[module] != parent:
        raise _invalid(f"Tensor '{shown}': {module} is under {_PARENT[module]}, not {parent}.")
    if layer >= base.num_layers:
        raise _invalid(
            f"Tensor '{shown}' is for layer {layer}; the base model has {base.num_layers} layers."
        )
    return layer, module, kind


def _check_tensor(
    name: str, info: Any, base: BaseShapes, module: str, kind: str, rank: int
) -> tuple[int, int]:
    """The tensor's byte span, once its dtype, shape and offsets are right."""
    shown = name[:120]
    shape = info.get("shape") if isinstance(info, dict) else None
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    dtype = info.get("dtype") if isinstance(info, dict) else None
    if (
        dtype not in DTYPE_BYTES
        or not isinstance(shape, list)
        or not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in [*shape, *offsets])
    ):
        raise _invalid(f"Tensor '{shown}' of {ADAPTER_WEIGHTS} is malformed.")
    fan_in, fan_out = base.features(module) or (0, 0)
    expected = [rank, fan_in] if kind == "A" else [fan_out, rank]
    if shape != expected:
        raise _invalid(
            f"Tensor '{shown}' has shape {shape[:4]}; this base model's {module} with rank "
            f"{rank} needs {expected}."
        )
    start, end = offsets
    if start < 0 or end - start != expected[0] * expected[1] * DTYPE_BYTES[str(dtype)]:
        raise _invalid(f"Tensor '{shown}': its data_offsets do not match its shape and dtype.")
    return start, end


def _check_spans(spans: list[tuple[int, int]], body: int) -> None:
    """The tensors' data must tile the file's data exactly (as safetensors requires)."""
    position = 0
    for start, end in sorted(spans):
        if start != position:
            raise _invalid(f"{ADAPTER_WEIGHTS}' tensors overlap or leave gaps.")
        position = end
    if position != body:
        raise _invalid(f"{ADAPTER_WEIGHTS}' data does not match its header.")


def _check_targets(targets: frozenset[str], modules: set[str], base: BaseShapes) -> None:
    offered = {name for name, _, _ in base.modules} & SUPPORTED_TARGET_MODULES
    foreign = sorted(targets - offered)
    if foreign:
        raise _invalid(
            f"target_modules names modules this base model does not offer to adapters: "
            f"{', '.join(t[:40] for t in foreign[:8])}; it offers {', '.join(sorted(offered))}.",
            code="unsupported_target_modules",
        )
    if targets != modules:
        raise _invalid(
            f"target_modules ({', '.join(sorted(targets))}) differs from the modules the "
            f"weights adapt ({', '.join(sorted(modules))})."
        )
