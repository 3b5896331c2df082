"""Wire formats of ``/api/dedicated`` (docs/reference/dedicated.md).

Requests refuse unknown fields (a typo in a scaling policy must not silently
leave the platform default in force) and are strict about types: the API's
integers and booleans are JSON integers and booleans, so ``"1"``, ``2.5``,
``true`` for a count or ``1`` for a boolean are 400 ``invalid_value`` rather
than silently coerced. An integral number written ``2.0`` is the integer 2, as
JSON Schema (the published OpenAPI document) says it is. Several records have keys that are
*absent* rather than null in some cases (policy keys never set, the
``month_cost_rate_matches_card`` of a model that left the catalog, hybrid-only
``capacity_converging``): their serializers drop those keys instead of every
route remembering to.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from serve_app.protocol.common import WholeInt

SLUG_PATTERN = r"^[a-z0-9-]{3,24}$"
"""What an endpoint's slug may be (its alias is ``ded/<slug>``); ``dedicated/alias.py``
parses aliases by it."""

Mode = Literal["spot", "reserved", "hybrid"]
Profile = Literal["economical", "balanced", "latency_first"]
StateProfile = Literal["economical", "balanced", "latency_first", "custom"]
Status = Literal["provisioning", "warming", "updating", "active", "paused", "error", "deleted"]
Window = Literal["1h", "24h", "7d"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _drop_none(handler: SerializerFunctionWrapHandler, value: Any, keys: set[str] | None) -> Any:
    data = handler(value)
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if v is not None or (keys and k not in keys)}
    return data


# ---------------------------------------------------------------- scaling (2.6)
class DedicatedScalingPolicy(_Request):
    """Autoscaling knobs; an absent field means the platform default governs."""

    buffer_replicas: WholeInt | None = Field(
        default=None, ge=0, le=10, description="Hot spares held ahead of demand under traffic."
    )
    max_queue_depth: WholeInt | None = Field(
        default=None, ge=0, le=10000, description="Queue length past which calls get 503; 0 = off."
    )
    scale_down_idle_seconds: WholeInt | None = Field(
        default=None, ge=30, le=3600, description="Warm time after traffic stops."
    )
    scaledown_window_seconds: WholeInt | None = Field(
        default=None, ge=30, le=3600, description="Policy-level window (newer backends only)."
    )
    target_inputs: WholeInt | None = Field(
        default=None,
        ge=1,
        le=100,
        description="Requests one replica handles before another starts.",
    )
    engine_target_waiting: WholeInt | None = Field(
        default=None, ge=1, le=1000, description="Engine-waiting requests tolerated before scaling."
    )

    @model_serializer(mode="wrap")
    def _absent_when_unset(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _drop_none(handler, self, None)

    def set_fields(self) -> dict[str, int]:
        """Only the knobs that carry a value (what is stored and compared)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class DedicatedScalingState(DedicatedScalingPolicy):
    """The stored policy plus the preset it matches (``custom`` when none)."""

    model_config = ConfigDict(extra="forbid")
    profile: StateProfile


class DedicatedScalingBounds(BaseModel):
    target_inputs_max: int
    buffer_replicas_max: int
    scale_down_idle_seconds_min: int
    scale_down_idle_seconds_max: int
    scaledown_window_seconds_min: int
    scaledown_window_seconds_max: int
    max_queue_depth_max: int
    engine_target_waiting_max: int
    queue_signal: bool
    default_profile: Profile
    profiles: dict[Profile, DedicatedScalingPolicy]


# ---------------------------------------------------------------- engine (2.7)
class DedicatedEngineConfig(_Request):
    """Engine settings that replace the recipe defaults they name."""

    max_model_len: WholeInt | None = Field(
        default=None,
        ge=64,
        description="Context window; the model's offer bounds it (chat models: >= 1024).",
    )
    max_num_seqs: WholeInt | None = Field(
        default=None, ge=1, description="Sequences batched at once."
    )
    prefix_caching: bool | None = Field(default=None, description="Reuse KV of shared prefixes.")
    speculative_tokens: WholeInt | None = Field(
        default=None, ge=0, description="Speculative depth; 0 = off; declared depths only."
    )

    @model_serializer(mode="wrap")
    def _absent_when_unset(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _drop_none(handler, self, None)


class DedicatedEngineSetting(BaseModel):
    available: bool
    reason: str | None
    default: int | bool | None
    min: int | None = None
    max: int | None = None
    choices: list[int] | None = None

    @model_serializer(mode="wrap")
    def _choices_only_when_set(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _drop_none(handler, self, {"choices"})


class DedicatedEngineBounds(BaseModel):
    max_model_len: DedicatedEngineSetting
    max_num_seqs: DedicatedEngineSetting
    prefix_caching: DedicatedEngineSetting
    speculative_tokens: DedicatedEngineSetting


# ---------------------------------------------------------------- requests (2.2-2.4)
class DedicatedCreateRequest(_Request):
    model_id: str = Field(min_length=1, description="Active catalog model to clone.")
    alias_slug: str = Field(pattern=SLUG_PATTERN, description="The alias is ded/<slug>.")
    mode: Mode
    min_replicas: WholeInt = Field(ge=0, description="0 scales to zero at rest.")
    max_replicas: WholeInt = Field(ge=1, description="Capped by the organization cap.")
    reserved_floor: WholeInt | None = Field(
        default=None, description="Hybrid only, 1..max_replicas (below 1: reserved_floor_required)."
    )
    engine: DedicatedEngineConfig | None = None
    scaling: DedicatedScalingPolicy | None = None


class DedicatedPatchRequest(_Request):
    """Omitted fields are unchanged; ``scaling: null`` restores the default preset."""

    min_replicas: WholeInt | None = Field(default=None, ge=0)
    max_replicas: WholeInt | None = Field(default=None, ge=1)
    reserved_floor: WholeInt | None = Field(
        default=None, description="Hybrid only; null: unchanged."
    )
    scaling: DedicatedScalingPolicy | None = None
    mode: Any = Field(default=None, description="Refused: a mode change is PUT .../mode.")


class DedicatedModeTarget(_Request):
    """Body of the preview. ``confirm_redeploy`` is accepted and ignored so the PUT's
    own body can be quoted as is (the preview never deploys anything)."""

    mode: Mode
    reserved_floor: WholeInt | None = Field(
        default=None, description="Hybrid only, >= 1 (below 1: reserved_floor_required)."
    )
    confirm_redeploy: Any = Field(default=None, description="Ignored by the preview.")


class DedicatedModeChange(DedicatedModeTarget):
    """Body of ``PUT /api/dedicated/{id}/mode`` (a billed redeploy)."""

    confirm_redeploy: Any = Field(default=None, description="Must be exactly true.")


class DedicatedEngineChange(_Request):
    """Body of ``PUT /api/dedicated/{id}/engine`` (a billed redeploy)."""

    engine: DedicatedEngineConfig | None = Field(
        default=None, description="The new settings; null restores recipe defaults."
    )
    confirm_redeploy: Any = Field(default=None, description="Must be exactly true.")


# ---------------------------------------------------------------- records (2.1, 2.5, 2.8)
class LiveReplicas(BaseModel):
    replicas_ready: int
    replicas_total: int


class MonthMinutes(BaseModel):
    reserved: float
    spot: float


class DedicatedEndpoint(BaseModel):
    endpoint_id: str
    model_id: str
    alias: str
    mode: Mode
    min_replicas: int
    max_replicas: int
    reserved_floor: int
    status: Status
    created_at: datetime
    cards_per_replica: int
    live: LiveReplicas | None
    month_minutes: MonthMinutes
    month_cost: float
    month_cost_usd: float = Field(description="Deprecated; same number as month_cost.")
    month_cost_rate_matches_card: bool | None = None
    scaling: DedicatedScalingState | None
    scaling_bounds: DedicatedScalingBounds
    mode_changed_at: datetime | None
    previous_mode: Mode | None
    engine: DedicatedEngineConfig | None
    engine_bounds: DedicatedEngineBounds
    engine_changed_at: datetime | None
    capacity_converging: bool | None = None

    @model_serializer(mode="wrap")
    def _optional_keys(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _drop_none(handler, self, {"month_cost_rate_matches_card", "capacity_converging"})


class ModeSide(BaseModel):
    mode: Mode
    reserved_floor: int


class ModeReload(BaseModel):
    replicas_reloaded: int
    replicas_reserved: int
    replicas_spot: int
    cards_per_replica: int
    estimated_boot_seconds: int
    estimate_source: Literal["observed", "default"]
    rate_per_card_minute: float
    rate_per_card_minute_reserved: float
    rate_per_card_minute_spot: float
    currency: Literal["eur"] = "eur"
    estimated_cost: float
    estimated_cost_usd: float = Field(description="Deprecated; same number as estimated_cost.")


class DedicatedModePreview(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    endpoint_id: str
    from_: ModeSide = Field(
        validation_alias=AliasChoices("from", "from_"), serialization_alias="from"
    )
    to: ModeSide
    kind: Literal["redeploy"] = "redeploy"
    allowed: bool
    blocked_reason: str | None
    reload: ModeReload
    unavailable_window_seconds: int
    rate_per_card_minute_before: float
    rate_per_card_minute_after: float
    cooldown_seconds_remaining: int


class CardHourly(BaseModel):
    reserved: float | None = None
    spot: float | None = None

    @model_serializer(mode="wrap")
    def _offered_classes_only(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _drop_none(handler, self, None)


class DedicatedRateCard(BaseModel):
    spot: float
    reserved: float
    currency: Literal["eur"] = "eur"
    max_replicas_cap: int
    applies_to_gpu_type: str
    hourly_by_gpu_type: dict[str, CardHourly]
    unpriced_gpu_types: list[str]


# ---------------------------------------------------------------- monitoring (2.9)
class DedicatedScalingEvent(BaseModel):
    replica_id: str
    version: int
    scaled_up_at: datetime
    ready_at: datetime | None
    drain_requested_at: datetime | None
    scaled_down_at: datetime | None
    state: str
    error_code: str | None
    calls_total: int
    boot_seconds: float | None
    served_seconds: float | None
    capacity_class: Literal["spot", "reserved"] | None


class DedicatedScalingHistory(BaseModel):
    items: list[DedicatedScalingEvent]
    truncated: bool


class DedicatedPercentiles(BaseModel):
    p50: int | None
    p95: int | None
    max: int | None
    measured_requests: int


class DedicatedColdWait(DedicatedPercentiles):
    requests_with_wake: int


class DedicatedPrefixCache(BaseModel):
    prompt_tokens: int
    cached_prompt_tokens: int
    measured_requests: int
    hit_rate: float | None
    coverage: float
    block_tokens: int | None
    block_source: Literal["observed"] | None


class RequestOutcomes(BaseModel):
    ok: int
    incomplete: int
    error: int


class TokenTotals(BaseModel):
    prompt: int
    completion: int


class DedicatedTelemetry(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    window: Window
    from_: datetime = Field(
        validation_alias=AliasChoices("from", "from_"), serialization_alias="from"
    )
    to: datetime
    requests: RequestOutcomes
    tokens: TokenTotals
    ttft_ms: DedicatedPercentiles
    latency_ms: DedicatedPercentiles
    cold_wait_ms: DedicatedColdWait
    prefix_cache: DedicatedPrefixCache
    capacity_verdict: Literal["no_wake_observed", "constrained", "unknown"]


class QueueDepth(BaseModel):
    running: int
    waiting: int


class ReplicaSample(BaseModel):
    tok_s: float
    tokens: int
    age_s: float


class DedicatedReplicaHealth(BaseModel):
    sampled_at: datetime
    sampled: bool
    reason: Literal["no_ready_replica", "no_metrics"] | None
    queue: QueueDepth | None
    replicas: list[ReplicaSample]
    expected_tok_s: float | None
    slowest_tok_s: float | None
    fastest_tok_s: float | None
    replicas_sampled: int
    verdict: Literal["ok", "degraded", "unknown"]
