"""The prepared-model fixtures, and quiet offline vLLM, for the local models' tests
(preparation, the tiny demo builders)."""

from __future__ import annotations

from tests.fixtures.prepared_models import (  # noqa: F401 (fixtures)
    qwen_coder_dir,
    smollm2_dir,
)
