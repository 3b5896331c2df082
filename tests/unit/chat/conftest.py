"""The prepared-model fixtures, and quiet offline vLLM, for the text backends' tests
(vLLM engine, chat templates, tool and reasoning parsers)."""

from __future__ import annotations

from tests.fixtures.prepared_models import (  # noqa: F401 (fixtures)
    qwen_coder_dir,
    qwen_tokenizer,
    qwen_tool_model_dir,
    smollm2_dir,
)
