"""The engine offer of a pooling model (embeddings, scores) for a dedicated endpoint.

A pooling head runs vLLM's pooling runner (``deployments.embeddings.config``): it
takes ``max_model_len`` and ``max_num_seqs`` like a chat engine, but an encoder
keeps no prefix cache between calls and generates nothing to speculate on, so
those two settings are never offered (reason ``pooling_model``). Its windows are
short (all-MiniLM-L6-v2: 512 tokens), so the floor of ``max_model_len`` is
``POOLING_MIN_MODEL_LEN``, not the chat models' 1024. The settings become the same
config keys (``engine.engine_config_for``).
"""

from __future__ import annotations

from typing import Any

from serve_app.catalog.config import CatalogModel
from serve_app.dedicated.offer.engine import (
    EngineOffer,
    engine_offer,
    max_num_seqs_setting,
    offer_of,
)
from serve_app.dedicated.options import DedicatedModelOptions, EngineSettingName
from serve_app.protocol.dedicated import DedicatedEngineSetting

POOLING_MIN_MODEL_LEN = 64
VLLM_POOLING_DEFAULT_MAX_NUM_SEQS = 64  # VLLMPoolingConfig's default (a test checks it)


def _max_model_len(config: dict[str, Any], model: CatalogModel) -> DedicatedEngineSetting:
    top = config.get("max_model_len") or model.context_length
    if top is None or top < POOLING_MIN_MODEL_LEN:
        return DedicatedEngineSetting(available=False, reason="default_unknown", default=top)
    return DedicatedEngineSetting(
        available=True, reason=None, default=top, min=POOLING_MIN_MODEL_LEN, max=top
    )


def pooling_engine_offer(model: CatalogModel, options: DedicatedModelOptions) -> EngineOffer:
    """What ``engine_bounds`` publishes for a pooling model."""
    config = dict(model.engine.config)
    vllm = model.engine.backend == "vllm"
    model_bound = options.admission_bound or model.deployment.max_ongoing_requests
    if vllm and "max_num_seqs" not in config:
        config_for_default = {**config, "max_num_seqs": VLLM_POOLING_DEFAULT_MAX_NUM_SEQS}
    else:
        config_for_default = config
    top = options.max_concurrent_inputs or model_bound
    settings: dict[EngineSettingName, DedicatedEngineSetting] = {
        "max_model_len": _max_model_len(config, model),
        "max_num_seqs": max_num_seqs_setting(config_for_default, vllm, top),
        "prefix_caching": DedicatedEngineSetting(
            available=False, reason="pooling_model", default=False
        ),
        "speculative_tokens": DedicatedEngineSetting(
            available=False, reason="pooling_model", default=0, min=0, max=0, choices=[0]
        ),
    }
    # The two pooling_model settings are refused whatever the backend declares.
    return offer_of(
        model, options, config, model_bound, settings, ("max_model_len", "max_num_seqs")
    )


def offer_for(model: CatalogModel, options: DedicatedModelOptions) -> EngineOffer:
    """The engine offer of any eligible model: pooling or chat."""
    if model.head == "pooling":
        return pooling_engine_offer(model, options)
    return engine_offer(model, options)
