"""The ``dedicated:`` section of the gateway args (typed, ``extra="forbid"``).

Everything the API leaves to the operator lives here: the rate card, the
ineligible models, the scaling presets, the replica caps, the org quota, the
shared redeploy cooldown, the monthly spending cap, and how each catalog model
is offered for dedicated use (card, cards per replica, admission bound,
speculative depths...). ``serve_app.config`` only adds the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from serve_app.protocol.dedicated import DedicatedScalingPolicy, Profile

CapacityClass = Literal["reserved", "spot"]
EngineSettingName = Literal["max_model_len", "max_num_seqs", "prefix_caching", "speculative_tokens"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CardRate(_Strict):
    """Hourly price of one card per capacity class; an absent class is not offered on it."""

    reserved: float | None = Field(default=None, ge=0, description="EUR per card per hour.")
    spot: float | None = Field(default=None, ge=0, description="EUR per card per hour.")


def _default_cards() -> dict[str, CardRate]:
    return {
        "h100": CardRate(reserved=3.60, spot=1.80),
        "l40s": CardRate(reserved=1.50, spot=0.75),
        "a10g": CardRate(reserved=0.95),
        "cpu": CardRate(reserved=0.12, spot=0.06),
    }


class RateCardOptions(_Strict):
    currency: Literal["eur"] = Field(default="eur", description="Currency of every figure.")
    applies_to_gpu_type: str = Field(
        default="h100", description="Card whose per-minute rates head GET /api/dedicated/rates."
    )
    hourly_by_gpu_type: dict[str, CardRate] = Field(
        default_factory=_default_cards, description="Card name -> hourly rates per class."
    )
    unpriced_gpu_types: list[str] = Field(
        default_factory=list, description="Cards with no rate at all (minutes count as zero)."
    )


class PresetOptions(_Strict):
    """One named scaling preset and the platform-side knobs that go with it."""

    policy: DedicatedScalingPolicy = Field(description="Policy values the preset stands for.")
    upscale_delay_s: float = Field(
        default=30.0, ge=0, description="Serve upscale_delay_s used with this preset."
    )


def _default_presets() -> dict[Profile, PresetOptions]:
    return {
        "economical": PresetOptions(
            policy=DedicatedScalingPolicy(
                target_inputs=16, buffer_replicas=0, scale_down_idle_seconds=60
            ),
            upscale_delay_s=60.0,
        ),
        "balanced": PresetOptions(
            policy=DedicatedScalingPolicy(
                target_inputs=8, buffer_replicas=0, scale_down_idle_seconds=300
            ),
            upscale_delay_s=30.0,
        ),
        "latency_first": PresetOptions(
            policy=DedicatedScalingPolicy(
                target_inputs=2, buffer_replicas=1, scale_down_idle_seconds=900
            ),
            upscale_delay_s=5.0,
        ),
    }


class DedicatedModelOptions(_Strict):
    """How one catalog model is offered for dedicated use (all optional)."""

    gpu_type: str | None = Field(
        default=None, description="Card it runs on; default: default_gpu_type."
    )
    cards_per_replica: int | None = Field(
        default=None, ge=1, description="Cards one replica holds; default: tensor_parallel_size."
    )
    admission_bound: int | None = Field(
        default=None,
        ge=1,
        description="Model's concurrent-input bound; default: catalog max_ongoing_requests.",
    )
    max_concurrent_inputs: int | None = Field(
        default=None, ge=1, description="Upper bound of max_num_seqs; default: admission_bound."
    )
    offered_settings: list[EngineSettingName] | None = Field(
        default=None,
        description="Engine settings a non-vLLM backend honours (vLLM offers all it can).",
    )
    speculative_depths: list[int] = Field(
        default_factory=list, description="Declared speculative depths; empty: no MTP head."
    )
    speculative_method: str = Field(default="mtp", description="vLLM speculative method.")
    prefix_cache: Literal["configurable", "inert", "locked_off"] = Field(
        default="configurable", description="Whether prefix caching can be switched."
    )
    queue_signal: bool = Field(
        default=False, description="The engine reports waiting requests (engine_target_waiting)."
    )
    default_profile: Profile | None = Field(default=None, description="Preset used by default.")
    expected_tok_s: float | None = Field(
        default=None, gt=0, description="Per-replica decode rate the health verdict compares to."
    )
    ray_actor_options: dict[str, Any] | None = Field(
        default=None, description="Replica resources; default: the catalog head's (class added)."
    )


def _default_ineligible() -> list[str]:
    return ["example-provider/chat-large", "orpheus-tts", "whisper-large-v3", "ltx-video"]


def _default_capacity_resources() -> dict[CapacityClass, str]:
    return {"reserved": "capacity_reserved", "spot": "capacity_spot"}


class DedicatedOptions(_Strict):
    """Dedicated endpoints (docs/reference/dedicated.md); every figure here is an operator
    choice."""

    enabled: bool = Field(default=True, description="Serve /api/dedicated and ded/<slug>.")
    rate_card: RateCardOptions = Field(default_factory=RateCardOptions)
    default_gpu_type: str = Field(default="h100", description="Card of models not listed.")
    ineligible_models: list[str] = Field(
        default_factory=_default_ineligible, description="Catalog ids refused for dedicated use."
    )
    models: dict[str, DedicatedModelOptions] = Field(
        default_factory=dict, description="Per-model offer, keyed by catalog id."
    )
    presets: dict[Profile, PresetOptions] = Field(default_factory=_default_presets)
    default_profile: Profile = Field(default="balanced", description="Preset when none given.")
    org_endpoint_quota: int = Field(default=2, ge=0, description="Non-deleted endpoints per org.")
    replica_cap: int = Field(default=16, ge=1, le=32, description="Replica cap per org.")
    replica_cap_internal: int = Field(default=32, ge=1, le=32, description="Internal orgs' cap.")
    cooldown_s: float = Field(
        default=600.0, ge=0, description="Shared cooldown after a mode or engine change."
    )
    monthly_spend_cap: float | None = Field(
        default=500.0, ge=0, description="EUR per org per month; 402 on redeploys and resume."
    )
    default_boot_seconds: int = Field(
        default=180, ge=1, description="Boot estimate before an endpoint has booted once."
    )
    boot_timeout_s: float = Field(
        default=1800.0, gt=0, description="A boot not ready by then counts as failed."
    )
    scaledown_window_supported: bool = Field(
        default=False, description="The scheduling backend honours scaledown_window_seconds."
    )
    reconcile_interval_s: float = Field(default=2.0, gt=0, description="Reconciler period.")
    lease_ttl_s: float = Field(
        default=15.0, gt=0, description="Reconciler lease; another replica takes over after it."
    )
    refresh_s: float = Field(
        default=1.0, gt=0, description="How often each replica re-reads endpoint states."
    )
    capacity_resources: dict[CapacityClass, str] = Field(
        default_factory=_default_capacity_resources,
        description="Ray custom resource that marks nodes of each class (cluster.yaml).",
    )
    capacity_resource_amount: float = Field(
        default=0.001, gt=0, description="Amount of the class resource one replica asks for."
    )
    warming_retry_after_s: int = Field(default=10, ge=1, description="Retry-After while warming.")
    wake_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="First-event wait of a call that boots a replica from zero (the boot "
        "included); other calls get timeouts.first_event_s.",
    )
    max_constructor_retry_count: int = Field(
        default=3, ge=1, description="Failed replica starts before Serve gives a deploy up."
    )
    history_limit: int = Field(default=200, ge=1, description="Scaling-history items returned.")

    def model_options(self, model_id: str) -> DedicatedModelOptions:
        return self.models.get(model_id) or DedicatedModelOptions()
