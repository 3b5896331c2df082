"""Typed catalog entries as written in ``configs/*.yaml`` (docs/reference/models.md#model-card).

One ``CatalogModel`` describes what the gateway publishes about a model
(``GET /v1/models``), which guardrails apply to it, how it is priced, and how
its head deployment is built. Validation is strict (``extra="forbid"``) so a
typo in an ops config fails at ``serve deploy`` instead of at the first call.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.contract.adapters import NAME_PATTERN, RESERVED_NAMES, AdapterRef
from serve_app.contract.head_kinds import HeadKind

Modality = Literal["text", "image", "audio", "video", "embedding", "score", "json"]
ReasoningFormat = Literal["none", "think_tags", "harmony"]
ScoreKind = Literal["bi-encoder", "cross-encoder"]
Routing = Literal["prefix", "pow2"]
ADAPTER_HEAD_SUFFIX = "+lora"
"""A chat model's adapter head id is its id and this (a character no model id contains)."""
DEMO_TIER = "demo"
"""Tier of random-weight stand-ins: they run the real code path, their output means nothing."""


def _text_only() -> list[Modality]:
    return ["text"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReasoningConfig(_Strict):
    """How (and whether) the model deliberates."""

    controllable: bool = Field(
        default=False,
        description="chat_template_kwargs.enable_thinking switches deliberation on and off.",
    )
    separate_channel: bool = Field(
        default=False,
        description="Deliberation comes back in reasoning_content, not inline in content.",
    )
    format: ReasoningFormat = Field(
        default="none",
        description=(
            "none; think_tags (<think>...</think> split by the engine); harmony "
            "(reads reasoning_effort grades: low, medium, high)."
        ),
    )


class PoolingSpec(_Strict):
    """What a pooling model (``head: pooling``) gives: vectors, scores, or both."""

    dimensions: int | None = Field(
        default=None,
        ge=1,
        description="Length of the vectors /v1/embeddings returns; required with the "
        "'embedding' output modality.",
    )
    matryoshka_dimensions: list[int] | None = Field(
        default=None,
        description="Shorter lengths the model was trained to be cut to (Matryoshka); the "
        "request's `dimensions` must be one of them. None: `dimensions` is refused.",
    )
    score: ScoreKind | None = Field(
        default=None,
        description="How /v1/score and /v1/rerank score a pair: bi-encoder (the cosine of "
        "the two normalised embeddings) or cross-encoder (the pair read together); "
        "required with the 'score' output modality.",
    )
    truncates: bool = Field(
        default=False,
        description="Inputs longer than context_length are cut to it (the engine's "
        "`truncate: true`) instead of refused with 400 context_length_exceeded.",
    )


class PricingConfig(_Strict):
    """Prices in ``currency`` per million tokens (or per unit for non-text heads)."""

    mode: Literal["spot", "fixed", "external"] = Field(
        default="fixed", description="spot: scaled by spot_multiplier; fixed: flat; external."
    )
    currency: str = Field(default="eur", description="Currency of every price here.")
    input_per_mtok: float = Field(default=0.0, ge=0, description="Price per 1M prompt tokens.")
    output_per_mtok: float = Field(default=0.0, ge=0, description="Price per 1M output tokens.")
    per_image: float | None = Field(default=None, ge=0, description="Detect/parse heads.")
    per_audio_second: float | None = Field(default=None, ge=0, description="Audio heads.")
    per_video_second: float | None = Field(default=None, ge=0, description="Video heads.")
    spot_multiplier: float | None = Field(
        default=None, gt=0, description="Model-class coefficient applied to spot prices."
    )
    gpu_class: str | None = Field(default=None, description="GPU class the spot price is for.")

    @model_validator(mode="after")
    def _spot_needs_coefficient(self) -> PricingConfig:
        if self.mode == "spot" and (self.spot_multiplier is None or self.gpu_class is None):
            raise ValueError("pricing mode 'spot' needs spot_multiplier and gpu_class")
        return self


class ExternalProvider(_Strict):
    """An OpenAI-compatible upstream outside the service's own fleet."""

    base_url: str = Field(description="Upstream base URL ending in /v1.")
    base_url_env: str | None = Field(
        default=None,
        description="Environment variable that, when set and non-empty, replaces base_url "
        "(one catalog for several environments; `gateway run` sets it for the loopback "
        "provider so it follows --port).",
    )
    api_key_env: str = Field(description="Environment variable holding the upstream key.")
    upstream_model: str = Field(description="Model name the upstream expects.")
    notice: str = Field(
        default="This model is served by an external provider outside our infrastructure.",
        description="Disclosure sentence rendered verbatim to clients.",
    )
    region: str | None = Field(default=None, description="Informational region.")
    timeout_s: float = Field(default=120.0, gt=0, description="Per-request upstream timeout.")


class EngineSpec(_Strict):
    """Which engine backend a head runs and with what settings."""

    backend: str = Field(
        default="vllm", description="Registered backend name (vllm, or a test backend)."
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="Backend settings, validated by the backend."
    )


class DeploymentSpec(_Strict):
    """Ray Serve options for the model's head deployment."""

    num_replicas: int | Literal["auto"] | None = Field(
        default=1, description="Fixed replicas, 'auto', or None when autoscaling_config is set."
    )
    max_ongoing_requests: int = Field(default=16, ge=1, description="Admission per replica.")
    autoscaling_config: dict[str, Any] | None = Field(
        default=None, description="Ray Serve autoscaling_config; overrides num_replicas."
    )
    ray_actor_options: dict[str, Any] = Field(
        default_factory=lambda: {"num_cpus": 1},
        description="Resources per replica, e.g. {num_gpus: 1} on a GPU cluster.",
    )
    health_check_period_s: float = Field(default=10.0, gt=0)
    health_check_timeout_s: float = Field(default=30.0, gt=0)
    stream_batch_ms: float = Field(
        default=20.0,
        ge=0,
        le=1000,
        description="Chat heads: later tokens produced within this window cross to the "
        "gateway as one message (the first token never waits); 0 sends every event alone.",
    )
    routing: Routing | None = Field(
        default=None,
        description="Chat heads with more than one replica: 'prefix' sends a request to the "
        "replica that saw its longest prefix (same organization and adapter) unless that "
        "replica is overloaded; 'pow2' is Serve's default power of two choices. Unset: "
        "'prefix' for chat heads, 'pow2' for the others (docs/tuning.md#request-routing).",
    )
    routing_imbalance: int = Field(
        default=8,
        ge=0,
        description="routing 'prefix': when the queue of the replica holding the prefix "
        "exceeds the shortest by more than this many requests, the prefix is ignored and the "
        "least loaded one wins. Below the engine's batch (max_num_seqs) a longer queue only "
        "means a larger batch, while moving a conversation recomputes its whole history "
        "(docs/tuning.md#request-routing: 8 kept every reachable hit where 4 lost some).",
    )
    routing_tree_chars: int = Field(
        default=2_000_000,
        ge=1000,
        description="routing 'prefix': characters of prompts the router remembers across "
        "replicas before it forgets the least recently used.",
    )
    adapters_head: Literal["separate", "shared"] = Field(
        default="separate",
        description="Chat heads whose engine config has `lora`: 'separate' (the default) "
        "serves base-model requests from replicas without LoRA (vLLM's LoRA layers cost every "
        "request, adapter or not: 0.892 of vLLM's tokens/s shared, 1.010 separate) and adapter "
        "requests from a second deployment, `<deployment>-lora`, that sleeps when idle; "
        "'shared' serves both from the same LoRA-enabled replicas (one engine less in memory, "
        "no wake before the first adapter call; docs/tuning.md#adapters-and-base-traffic).",
    )


class AdapterPricing(_Strict):
    """An adapter's own prices (per million tokens, in the base model's currency)."""

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)


class CatalogAdapter(_Strict):
    """An operator's LoRA adapter on a chat model, usable by every organization as
    ``<model id>:<name>`` (docs/reference/adapters.md#operator-adapters)."""

    name: str = Field(pattern=NAME_PATTERN.pattern, description="The id's part after ':'.")
    path: str = Field(
        description="The adapter's folder on the head's host (adapter_config.json + "
        "adapter_model.safetensors), or 'prepared:<name>' for one built here."
    )
    description: str | None = None
    pricing: AdapterPricing | None = Field(
        default=None, description="Own prices; None: the base model's."
    )


class CatalogModel(_Strict):
    """One model of the catalog."""

    id: str = Field(min_length=1, description="Value of `model` in requests.")
    head: HeadKind = Field(description="Which route family serves it.")
    owned_by: str = Field(default="gateway", description="Owner shown in the catalog.")
    created: int = Field(default=0, ge=0, description="Epoch seconds added to the catalog.")
    publisher: str | None = None
    release_date: str | None = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}$")
    specialties: list[str] = Field(default_factory=list)
    input_modalities: list[Modality] = Field(default_factory=_text_only)
    output_modalities: list[Modality] = Field(default_factory=_text_only)
    context_length: int | None = Field(
        default=None, ge=1, description="Context window (max_model_len); None where meaningless."
    )
    max_output_tokens: int | None = Field(default=None, ge=1, description="max_tokens cap.")
    max_images_per_request: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Images one request may carry (chat heads: the engine's own limit_mm_per_prompt); "
            "None where the model takes no images."
        ),
    )
    native_tool_calling: bool = Field(
        default=False, description="Tool calls can be extracted (lists tools/tool_choice)."
    )
    structured_outputs: bool | None = Field(
        default=None,
        description="Grammar-backed decoding (response_format, text.format) holds; unset: "
        "derived (own-fleet vLLM heads yes, others no). False where the model cannot "
        "deliver it (a reasoner whose reasoning never ends).",
    )
    reasoning: ReasoningConfig = Field(default_factory=ReasoningConfig)
    pricing: PricingConfig = Field(default_factory=PricingConfig)
    external: ExternalProvider | None = Field(
        default=None, description="Served by a third party; listed only to enabled orgs."
    )
    tier: str | None = Field(
        default=None,
        description="Service tier; 'demo' marks random-weight stand-ins whose output means "
        "nothing.",
    )
    notice: str | None = Field(
        default=None,
        description="Published with the model card: what a user must know (e.g. demo weights).",
    )
    kind: str | None = None
    attribution: str | None = None
    pooling: PoolingSpec | None = Field(
        default=None, description="Pooling models (head: pooling): vector size and score kind."
    )
    dedicated_eligible: bool = Field(default=True, description="May back a dedicated endpoint.")
    memory_gib: float | None = Field(
        default=None,
        gt=0,
        description="Memory its head holds awake (GiB, measured: bench/memory_budget.py); "
        "what the heads' memory budget counts. Unset: the head is not counted (check warns).",
    )
    wake_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds its head takes to wake on the machine it is sized for "
        "(measured: bench/every_route.py): the `Retry-After` of `model_warming` until a "
        "gateway replica has timed a wake of its own. Unset: `readiness` default (10 s).",
    )
    pinned: bool = Field(
        default=False,
        description="Never put to sleep to make room under the memory budget (the default "
        "chat model's head).",
    )
    engine: EngineSpec = Field(default_factory=EngineSpec)
    deployment: DeploymentSpec = Field(default_factory=DeploymentSpec)
    adapters: list[CatalogAdapter] = Field(
        default_factory=list,
        description="Operator LoRA adapters (chat heads whose engine config has `lora`).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> CatalogModel:
        if self.external is not None and self.pricing.mode != "external":
            raise ValueError(f"{self.id}: external models need pricing.mode 'external'")
        if self.head == "chat" and (self.context_length is None or self.max_output_tokens is None):
            raise ValueError(f"{self.id}: chat models need context_length and max_output_tokens")
        if self.max_images_per_request is not None and "image" not in self.input_modalities:
            raise ValueError(f"{self.id}: max_images_per_request without image input")
        if self.tier == DEMO_TIER and not self.notice:
            raise ValueError(f"{self.id}: tier 'demo' needs a notice saying what really runs")
        if self.head == "pooling":
            self._pooling_consistent()
        if self.adapters:
            self._adapters_consistent()
        if self.id.endswith(ADAPTER_HEAD_SUFFIX):
            raise ValueError(f"{self.id}: ids ending in {ADAPTER_HEAD_SUFFIX!r} name adapter heads")
        if self.deployment.routing == "prefix" and self.head != "chat":
            raise ValueError(f"{self.id}: deployment.routing 'prefix' is for chat heads only")
        return self

    def _adapters_consistent(self) -> None:
        if self.head != "chat" or self.is_external or self.engine.config.get("lora") is None:
            raise ValueError(f"{self.id}: adapters need a chat head with engine.config.lora")
        names = [a.name for a in self.adapters]
        if len(set(names)) != len(names) or RESERVED_NAMES & set(names):
            raise ValueError(f"{self.id}: adapter names must be unique and not {RESERVED_NAMES}")

    def _pooling_consistent(self) -> None:
        spec = self.pooling
        outputs = set(self.output_modalities)
        if spec is None or self.context_length is None:
            raise ValueError(f"{self.id}: pooling models need `pooling` and context_length")
        if self.external is not None:
            raise ValueError(f"{self.id}: external pooling models are not supported yet")
        if not outputs or not outputs <= {"embedding", "score"}:
            raise ValueError(f"{self.id}: pooling models output 'embedding' and/or 'score'")
        if "embedding" in outputs and spec.dimensions is None:
            raise ValueError(f"{self.id}: the 'embedding' output needs pooling.dimensions")
        if "score" in outputs and spec.score is None:
            raise ValueError(f"{self.id}: the 'score' output needs pooling.score")
        bound = spec.dimensions or 0
        if any(not 1 <= d <= bound for d in spec.matryoshka_dimensions or []):
            raise ValueError(f"{self.id}: matryoshka_dimensions must lie in 1..dimensions")
        if self.engine.backend == "vllm" and bool(self.engine.config.get("truncate")) != (
            spec.truncates
        ):
            raise ValueError(f"{self.id}: pooling.truncates must equal engine.config.truncate")

    @property
    def is_external(self) -> bool:
        return self.external is not None

    @property
    def head_id(self) -> str:
        """The catalog id of the head that serves this model (an adapter's: its base's)."""
        return self.id

    @property
    def adapter_ref(self) -> AdapterRef | None:
        """The adapter a request for this model generates with (``AdapterModel``)."""
        return None

    @property
    def adapter_head_id(self) -> str | None:
        """The head that serves this model's adapters when it is not the model's own head:
        ``<id>+lora`` for a chat model with ``lora`` and ``deployment.adapters_head``
        'separate' (its own head then runs without LoRA); else None."""
        return self._adapter_head_of(self.id)

    def _adapter_head_of(self, base_id: str) -> str | None:
        separate = self.deployment.adapters_head == "separate"
        lora = self.engine.config.get("lora") is not None
        if self.head != "chat" or self.is_external or not lora or not separate:
            return None
        return f"{base_id}{ADAPTER_HEAD_SUFFIX}"

    @property
    def routing(self) -> Routing:
        """The head's request routing: as configured, else 'prefix' for chat heads."""
        if self.deployment.routing is not None:
            return self.deployment.routing
        return "prefix" if self.head == "chat" else "pow2"

    def deployment_name(self) -> str:
        """Ray Serve deployment name, shown on the dashboard."""
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in self.id)
        return f"{self.head}-{safe}"

    def head_deployments(self) -> dict[str, str]:
        """Head id -> Ray Serve deployment name, for every head this model runs: its own,
        and its adapter head where it has one (``adapter_head_id``)."""
        heads = {self.id: self.deployment_name()}
        if self.adapter_head_id is not None:
            heads[self.adapter_head_id] = f"{self.deployment_name()}-lora"
        return heads


class AdapterModel(CatalogModel):
    """A resolved ``<base>:<adapter>`` id: the base model's entry under the adapter's id.

    Built per request by the gateway (never written in a config), so metering, limits and
    answers see the adapter's id while the request goes to the base model's head.
    """

    base_id: str
    ref: AdapterRef
    owner_org: str | None = None
    """The organization that uploaded it; None for an operator adapter."""

    @property
    def head_id(self) -> str:
        """The base model's adapter head where it has one, else the base model's head (the
        adapter model carries the base's engine and deployment settings)."""
        return self._adapter_head_of(self.base_id) or self.base_id

    @property
    def adapter_head_id(self) -> str | None:
        return None  # an adapter has no adapters of its own

    @property
    def adapter_ref(self) -> AdapterRef | None:
        return self.ref

    @classmethod
    def of(
        cls,
        base: CatalogModel,
        ref: AdapterRef,
        pricing: PricingConfig | None = None,
        owner_org: str | None = None,
    ) -> AdapterModel:
        """``base`` under the adapter's id (its prices, or ``pricing``), not re-validated."""
        values = {name: getattr(base, name) for name in CatalogModel.model_fields}
        values.update(id=ref.model_id, adapters=[])
        if pricing is not None:
            values["pricing"] = pricing
        return cls.model_construct(**values, base_id=base.id, ref=ref, owner_org=owner_org)
