"""LoRA adapters: what the gateway and a chat head agree on (docs/reference/adapters.md).

An adapter is addressed as ``<base model id>:<adapter name>``. The gateway resolves
that id (the caller's organization's adapters, then the catalog's operator adapters)
into an ``AdapterRef`` it puts on the ``HeadRequest``; the head materialises the
adapter's files from the ref (the gateway's object store, or a folder on the head's
host) and loads them into its engine. ``LoraSettings`` is the ``lora:`` block of a
chat head's engine config: the head starts its engine with it, and the gateway
validates uploads against the same bounds before anything loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
"""The two files of a PEFT adapter this service accepts (safetensors only: never pickle)."""

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
"""Adapter names: lower case, no ``:`` (the id separator) and no path characters."""

RESERVED_NAMES = frozenset({"spot"})
"""``<model>:spot`` is the legacy spot suffix (docs/reference/common.md#versioning)."""

SUPPORTED_TARGET_MODULES = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
)
"""Projection layers of the Llama/Qwen-style decoders the heads serve that vLLM's LoRA
layers replace; an adapter targeting anything else (embeddings, lm_head) is refused."""

VLLM_MAX_LORA_RANKS = frozenset({1, 8, 16, 32, 64, 128, 256, 320, 512})
"""The ``max_lora_rank`` values vLLM accepts."""


class LoraSettings(BaseModel):
    """The ``lora:`` block of a vLLM chat head's engine config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_lora_rank: int = Field(
        default=16, description="Largest adapter rank (r) the engine accepts."
    )
    max_loras: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Adapters one replica keeps loaded (least recently used evicted), and "
        "adapters one engine batch may mix.",
    )
    max_cpu_loras: int | None = Field(
        default=None, ge=1, description="vLLM's CPU-side adapter cache; None: max_loras."
    )
    max_adapter_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Upper bound of an adapter's weights file (and of an upload, unpacked).",
    )

    @field_validator("max_lora_rank")
    @classmethod
    def _rank_vllm_knows(cls, value: int) -> int:
        """vLLM sizes its LoRA buffers for a fixed set of ranks and refuses others."""
        if value not in VLLM_MAX_LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {sorted(VLLM_MAX_LORA_RANKS)}")
        return value

    def engine_kwargs(self) -> dict[str, object]:
        """vLLM's engine args for these settings."""
        return {
            "enable_lora": True,
            "max_lora_rank": self.max_lora_rank,
            "max_loras": self.max_loras,
            "max_cpu_loras": self.max_cpu_loras or self.max_loras,
        }


@dataclass(frozen=True)
class AdapterRef:
    """One adapter as a head receives it on a request.

    ``key`` is the adapter's unique id and names this exact content (a new upload under
    an old name gets a new key; an uploaded adapter's is its ``lora-...`` id, an operator
    adapter's ``catalog:<base>:<name>``). Inside a head everything is keyed by it: vLLM's
    LoRA name, the loaded slots, Serve's multiplexed model id, the cache folder. Adapter
    names are unique only within an organization, so ``model_id`` must never key anything
    there: another organization's adapter, or a deleted one, has the same.
    """

    key: str
    model_id: str
    """``<base>:<name>``: for messages and logs only (the API's id, the usage rows')."""
    objects: tuple[tuple[str, str], ...] = ()
    """(file name, object key) pairs in the gateway's object store (uploaded adapters)."""
    path: str | None = None
    """A folder on the head's host, or ``prepared:<name>`` (operator adapters)."""


@dataclass(frozen=True)
class BaseShapes:
    """A base model's layers as a LoRA adapter sees them: what an upload is checked
    against before any engine sees it (docs/reference/adapters.md#validation).

    The chat head answers it from its model's config (``base_shapes``); the gateway asks
    once per base model (``adapter_base``) and checks every upload's tensors against it.
    """

    num_layers: int
    modules: tuple[tuple[str, int, int], ...]
    """(module name, in_features, out_features) of each module an adapter may target."""

    def features(self, module: str) -> tuple[int, int] | None:
        """(in_features, out_features) of ``module``; None where the base lacks it."""
        for name, fan_in, fan_out in self.modules:
            if name == module:
                return fan_in, fan_out
        return None


def base_shapes(config: dict[str, object]) -> BaseShapes | None:
    """From a Hugging Face decoder config of the Llama/Qwen/Mistral family (the text
    config of a multimodal one); None where it lacks the sizes. A mixture-of-experts
    model offers its attention projections only (its MLPs are experts)."""
    try:
        hidden = _positive(config["hidden_size"])
        layers = _positive(config["num_hidden_layers"])
        heads = _positive(config["num_attention_heads"])
        kv_heads = _positive(config.get("num_key_value_heads") or heads)
        head_dim = _positive(config.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError):
        return None
    modules = [
        ("q_proj", hidden, heads * head_dim),
        ("k_proj", hidden, kv_heads * head_dim),
        ("v_proj", hidden, kv_heads * head_dim),
        ("o_proj", heads * head_dim, hidden),
    ]
    experts = config.get("num_experts") or config.get("num_local_experts")
    intermediate = config.get("intermediate_size")
    if not experts and isinstance(intermediate, int) and intermediate > 0:
        modules += [
            ("gate_proj", hidden, intermediate),
            ("up_proj", hidden, intermediate),
            ("down_proj", intermediate, hidden),
        ]
    return BaseShapes(num_layers=layers, modules=tuple(modules))


def _positive(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(value)
    return value


ForgetReply = Literal["unloaded", "forgotten", "absent"]
"""A head replica's answer to ``forget_adapter(key)`` (a deleted adapter): it held the
adapter and dropped it (``unloaded``); it had dropped it on an earlier call
(``forgotten``: the router's view of which replica holds what was stale, or it picked
this replica as any); it never held it (``absent``). The gateway repeats the call while
replicas answer ``unloaded`` (docs/reference/adapters.md#deleting)."""


class AdapterObjects(Protocol):
    """What a head needs of the gateway's object store: an object's bytes."""

    def get(self, key: str) -> bytes: ...


def split_adapter_id(model_id: str) -> tuple[str, str] | None:
    """``<base>:<name>`` -> (base, name); None where ``model_id`` names no adapter."""
    base, sep, name = model_id.rpartition(":")
    if not sep or not base or name in RESERVED_NAMES or not NAME_PATTERN.fullmatch(name):
        return None
    return base, name
