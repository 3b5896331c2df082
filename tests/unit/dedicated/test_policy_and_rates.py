"""Pure rules: scaling bounds and presets, Serve options, the rate card and the cost formula."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from ray.serve.config import AutoscalingConfig

from serve_app.catalog.config import CatalogModel
from serve_app.dedicated.api.telemetry import percentile
from serve_app.dedicated.control.autoscaling import DedicatedAutoscalingPolicy
from serve_app.dedicated.offer.engine import (
    admission_bound,
    engine_config_for,
    engine_offer,
    validate_engine,
)
from serve_app.dedicated.offer.scaling import (
    POLICY_FUNCTION,
    Replicas,
    autoscaling_options,
    default_policy,
    detect_profile,
    scaling_bounds,
    target_inputs_max,
    validate_policy,
)
from serve_app.dedicated.options import DedicatedModelOptions, DedicatedOptions, RateCardOptions
from serve_app.dedicated.pricing.rates import (
    ReplicaSpan,
    estimated_cost,
    mode_priced,
    month_usage,
    rate_card_view,
    rate_per_card_minute,
)
from serve_app.protocol.dedicated import DedicatedEngineConfig, DedicatedScalingPolicy
from serve_app.protocol.errors import InvalidRequestError

OPTIONS = DedicatedOptions()


def _model(seqs: int | None = 8, ongoing: int = 32, backend: str = "vllm") -> CatalogModel:
    config = {"model": "m", "max_model_len": 8192}
    if seqs is not None:
        config["max_num_seqs"] = seqs
    return CatalogModel.model_validate(
        {
            "id": "m",
            "head": "chat",
            "context_length": 8192,
            "max_output_tokens": 512,
            "engine": {"backend": backend, "config": config},
            "deployment": {"max_ongoing_requests": ongoing},
        }
    )


@pytest.mark.parametrize(
    ("seqs", "bound", "expected"),
    [(4, 160, 8), (128, 160, 100), (64, 50, 50), (1, 16, 2)],
)
def test_target_inputs_max_is_min_of_100_and_admission(
    seqs: int, bound: int, expected: int
) -> None:
    offer = engine_offer(_model(seqs=seqs, ongoing=bound), DedicatedModelOptions())
    assert target_inputs_max(admission_bound(None, offer)) == expected
    # The endpoint's own max_num_seqs decides, not the recipe's.
    smaller = DedicatedEngineConfig(max_num_seqs=2)
    assert admission_bound(smaller, offer) == min(4, bound)


def test_presets_are_clamped_and_profiles_detected_exactly() -> None:
    bounds = scaling_bounds(OPTIONS, DedicatedModelOptions(), admission=4)
    assert bounds.target_inputs_max == 4
    assert bounds.profiles["economical"].target_inputs == 4  # 16 clamped to the bound
    assert bounds.default_profile == "balanced"
    assert "engine_target_waiting" not in bounds.profiles["balanced"].model_dump()
    assert detect_profile(default_policy(bounds), bounds.profiles) == "balanced"
    assert detect_profile(bounds.profiles["latency_first"], bounds.profiles) == "latency_first"
    changed = DedicatedScalingPolicy(
        **{**bounds.profiles["balanced"].set_fields(), "buffer_replicas": 3}
    )
    assert detect_profile(changed, bounds.profiles) == "custom"
    assert detect_profile(DedicatedScalingPolicy(target_inputs=4), bounds.profiles) == "custom"


def test_policy_refusals() -> None:
    bounds = scaling_bounds(OPTIONS, DedicatedModelOptions(), admission=8)
    for policy, code in [
        (DedicatedScalingPolicy(target_inputs=9), "target_inputs_exceeds_admission"),
        (DedicatedScalingPolicy(engine_target_waiting=5), "queue_signal_unavailable"),
        (DedicatedScalingPolicy(scaledown_window_seconds=60), "scaling_policy_unsupported"),
    ]:
        with pytest.raises(InvalidRequestError) as err:
            validate_policy(policy, bounds, OPTIONS)
        assert err.value.code == code
    signal = scaling_bounds(OPTIONS, DedicatedModelOptions(queue_signal=True), admission=8)
    validate_policy(DedicatedScalingPolicy(engine_target_waiting=5), signal, OPTIONS)


def test_autoscaling_options_from_policy() -> None:
    bounds = scaling_bounds(OPTIONS, DedicatedModelOptions(), admission=16)
    policy = DedicatedScalingPolicy(target_inputs=3, scale_down_idle_seconds=45, max_queue_depth=0)
    spot = autoscaling_options(policy, bounds, Replicas("spot", 0, 4, 0), OPTIONS)
    auto = spot["head"]["autoscaling_config"]
    assert auto["min_replicas"] == 0 and auto["initial_replicas"] == 0 and auto["max_replicas"] == 4
    assert auto["target_ongoing_requests"] == 3
    assert auto["downscale_delay_s"] == 45 and auto["downscale_to_zero_delay_s"] == 45
    assert auto["upscale_delay_s"] == OPTIONS.presets["balanced"].upscale_delay_s  # custom
    assert "policy" not in auto  # Serve's own policy suffices
    assert spot["head"]["max_queued_requests"] == -1  # 0 = unlimited
    AutoscalingConfig(**auto)

    spares = DedicatedScalingPolicy(buffer_replicas=2, max_queue_depth=50)
    hybrid = autoscaling_options(spares, bounds, Replicas("hybrid", 3, 5, 2), OPTIONS)
    assert hybrid["head"] == {"num_replicas": 2, "max_queued_requests": 50}
    burst = hybrid["burst"]["autoscaling_config"]
    assert (burst["min_replicas"], burst["max_replicas"]) == (1, 3)
    assert burst["policy"]["policy_function"] == POLICY_FUNCTION
    assert burst["policy"]["policy_kwargs"]["buffer_replicas"] == 2
    AutoscalingConfig(**burst)
    floor_only = autoscaling_options(spares, bounds, Replicas("hybrid", 2, 2, 2), OPTIONS)
    assert set(floor_only) == {"head"}


def _ctx(current: int, requests: float, waiting: float = 0.0) -> SimpleNamespace:
    config = AutoscalingConfig(min_replicas=0, max_replicas=10, target_ongoing_requests=2)
    return SimpleNamespace(
        current_num_replicas=current,
        target_num_replicas=current,
        total_num_requests=requests,
        config=config,
        policy_state={},
        aggregated_metrics={"engine_waiting": {"r1": waiting}},
    )


def test_custom_autoscaling_policy_adds_spares_and_reacts_to_waiting() -> None:
    assert DedicatedAutoscalingPolicy(buffer_replicas=2)(_ctx(2, 4))[0] == pytest.approx(4)
    assert DedicatedAutoscalingPolicy(buffer_replicas=2)(_ctx(2, 0))[0] == pytest.approx(0)
    waiting = DedicatedAutoscalingPolicy(engine_target_waiting=3)
    assert waiting(_ctx(2, 2, waiting=10))[0] >= 3
    assert waiting(_ctx(2, 4, waiting=1))[0] == pytest.approx(2)


def test_engine_offer_bounds_and_mapping() -> None:
    offer = engine_offer(_model(), DedicatedModelOptions(speculative_depths=[4, 2]))
    assert offer.bounds.max_model_len.min == 1024 and offer.bounds.max_model_len.max == 8192
    assert offer.bounds.max_num_seqs.default == 8 and offer.bounds.max_num_seqs.max == 32
    assert offer.bounds.speculative_tokens.choices == [0, 2, 4]
    engine = DedicatedEngineConfig(max_num_seqs=16, prefix_caching=False, speculative_tokens=2)
    validate_engine(engine, offer)
    config = engine_config_for(engine, offer)
    assert config["max_num_seqs"] == 16 and config["enable_prefix_caching"] is False
    assert config["engine_args"]["speculative_config"]["num_speculative_tokens"] == 2
    for bad, code in [
        (DedicatedEngineConfig(max_num_seqs=64), "invalid_value"),
        (DedicatedEngineConfig(speculative_tokens=3), "invalid_value"),
    ]:
        with pytest.raises(InvalidRequestError) as err:
            validate_engine(bad, offer)
        assert err.value.code == code
    plain = engine_offer(_model(), DedicatedModelOptions(prefix_cache="locked_off"))
    assert plain.bounds.speculative_tokens.reason == "no_mtp_head"
    assert plain.bounds.prefix_caching.reason == "prefix_cache_locked_off"
    script = engine_offer(_model(backend="pkg:Engine"), DedicatedModelOptions())
    assert script.bounds.max_num_seqs.reason == "script_ignores_setting"
    with pytest.raises(InvalidRequestError) as err:
        validate_engine(DedicatedEngineConfig(max_num_seqs=2), script)
    assert err.value.code == "engine_setting_unavailable"


def test_rates_are_hourly_over_sixty_unrounded() -> None:
    card = RateCardOptions(
        applies_to_gpu_type="x",
        hourly_by_gpu_type={"x": {"reserved": 1.0, "spot": 0.7}, "r": {"reserved": 2.0}},
        unpriced_gpu_types=["u"],
    )
    assert rate_per_card_minute(card, "x", "spot") == 0.7 / 60
    assert rate_per_card_minute(card, "r", "spot") is None
    assert rate_per_card_minute(card, "u", "reserved") is None
    assert mode_priced(card, "r", "reserved")
    assert not mode_priced(card, "r", "spot") and not mode_priced(card, "r", "hybrid")
    view = rate_card_view(card, 16)
    assert view.reserved == 1.0 / 60 and view.spot == 0.7 / 60 and view.max_replicas_cap == 16
    assert view.model_dump()["hourly_by_gpu_type"]["r"] == {"reserved": 2.0}


def test_estimated_cost_formula() -> None:
    # cards x (boot / 60) x (reserved x reserved rate + spot x spot rate)
    assert estimated_cost(2, 90, 1, 3, 0.05, 0.02) == pytest.approx(2 * 1.5 * (0.05 + 0.06))


def test_month_usage_from_replica_lifetimes() -> None:
    card = RateCardOptions(hourly_by_gpu_type={"g": {"reserved": 6.0, "spot": 3.0}})
    now = datetime(2031, 5, 10, 12, 0, tzinfo=UTC)
    spans = [
        ReplicaSpan(now - timedelta(minutes=30), now - timedelta(minutes=20), "spot", "g", 2),
        ReplicaSpan(now - timedelta(minutes=5), None, "reserved", "g", 1),
        # Started last month: only this month's part counts.
        ReplicaSpan(
            datetime(2031, 4, 30, 23, 0, tzinfo=UTC),
            datetime(2031, 5, 1, 0, 30, tzinfo=UTC),
            "spot",
            "g",
            1,
        ),
        ReplicaSpan(now - timedelta(minutes=3), now - timedelta(minutes=1), "spot", "nope", 1),
    ]
    usage = month_usage(spans, card, now)
    assert usage.minutes_spot == pytest.approx(10 + 30 + 2)
    assert usage.minutes_reserved == pytest.approx(5)
    assert usage.cost == pytest.approx(10 * 2 * 0.05 + 30 * 0.05 + 5 * 0.1)
    assert usage.rate_matches_card is False  # the unknown card counted as zero


def test_percentile_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([5, 1, 3], 0.5) == 3
    assert percentile(list(range(1, 101)), 0.95) == 95
