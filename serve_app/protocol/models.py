"""Wire format of ``GET /v1/models`` (docs/reference/models.md#model-card,
docs/reference/common.md#external-models)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ResidencyRouting(BaseModel):
    """Disclosure that a third party served (or serves) the request."""

    provider_class: Literal["external"] = "external"
    residency: Literal["external"] = "external"
    notice: str
    region: str | None = None


class Architecture(BaseModel):
    input_modalities: list[str]
    output_modalities: list[str]


class ReasoningInfo(BaseModel):
    controllable: bool
    separate_channel: bool


class PoolingInfo(BaseModel):
    """What a pooling model gives (docs/api.md, "Embeddings, rerank and score")."""

    dimensions: int | None = Field(default=None, description="Length of its embeddings.")
    matryoshka_dimensions: list[int] | None = Field(
        default=None, description="Values `dimensions` may take; absent: not supported."
    )
    score: str | None = Field(
        default=None,
        description="bi-encoder: a score is the cosine of the two embeddings; "
        "cross-encoder: the model reads the pair together.",
    )
    truncates: bool = Field(
        default=False, description="Longer inputs are cut to context_length, not refused."
    )


class ModelCard(BaseModel):
    """One catalog entry as published. Dumped with ``exclude_none``: absent, not null."""

    id: str
    object: Literal["model"] = "model"
    owned_by: str
    created: int
    architecture: Architecture
    context_length: int | None = None
    context_window: int | None = None
    max_model_len: int | None = None
    max_output_tokens: int | None = None
    pricing_mode: str
    spot_enabled: bool
    spot_multiplier: float | None = None
    gpu_class: str | None = None
    publisher: str | None = None
    release_date: str | None = None
    specialties: list[str] | None = None
    reasoning: ReasoningInfo | None = None
    supported_parameters: list[str] | None = None
    pricing: dict[str, Any] | None = None
    routing: ResidencyRouting | None = None
    tier: str | None = None
    notice: str | None = None
    """What a user must know about what runs (``tier: demo``: random-weight stand-in)."""
    kind: str | None = None
    attribution: str | None = None
    pooling: PoolingInfo | None = None
    """Embedding and scoring models only."""
    parent: str | None = None
    """LoRA adapters only (``<base>:<adapter>`` ids): the base model's id, as vLLM's own
    model list names it (docs/reference/adapters.md#models-list)."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)
