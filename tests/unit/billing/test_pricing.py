"""Prices applied to usage: fixed, spot (scaled by the model-class coefficient), external."""

from __future__ import annotations

import pytest

from serve_app.billing.pricing import ToolPrices, cost_of, price_applied
from serve_app.billing.records import UsageQuantities
from serve_app.catalog.config import PricingConfig
from tests.unit.billing.records import make_record

USAGE = UsageQuantities(prompt_tokens=2_000_000, completion_tokens=500_000, cached_tokens=1_000_000)


def test_fixed_price_bills_cached_tokens_like_any_prompt_token() -> None:
    price = price_applied(PricingConfig(mode="fixed", input_per_mtok=0.5, output_per_mtok=2.0))
    assert cost_of(price, USAGE) == pytest.approx(2 * 0.5 + 0.5 * 2.0)
    assert price.spot_multiplier is None


def test_spot_price_is_scaled_by_the_model_class_coefficient() -> None:
    pricing = PricingConfig(
        mode="spot", input_per_mtok=0.5, output_per_mtok=2.0, spot_multiplier=0.4, gpu_class="l4"
    )
    price = price_applied(pricing)
    assert price.spot_multiplier == 0.4
    assert cost_of(price, USAGE) == pytest.approx((2 * 0.5 + 0.5 * 2.0) * 0.4)


def test_external_price_is_passed_on() -> None:
    price = price_applied(PricingConfig(mode="external", input_per_mtok=3.0, output_per_mtok=15.0))
    assert price.pricing_mode == "external"
    assert cost_of(price, USAGE) == pytest.approx(2 * 3.0 + 0.5 * 15.0)


def test_per_unit_prices_for_images_and_audio() -> None:
    price = price_applied(PricingConfig(per_image=0.01, per_audio_second=0.002))
    usage = UsageQuantities(images=3, audio_seconds=10.5)
    assert cost_of(price, usage) == pytest.approx(0.03 + 0.021)


def test_record_carries_the_price_it_was_billed_at() -> None:
    record = make_record(
        "r1",
        usage=UsageQuantities(prompt_tokens=10, completion_tokens=4, requests=3),
        pricing=PricingConfig(currency="usd", input_per_mtok=1.0, output_per_mtok=3.0),
    )
    assert (record.currency, record.pricing_mode, record.requests) == ("usd", "fixed", 3)
    assert (record.input_per_mtok, record.output_per_mtok) == (1.0, 3.0)
    assert record.cost == pytest.approx((10 * 1.0 + 4 * 3.0) / 1e6)
    assert type(record).from_json(record.to_json()) == record


def test_searches_and_code_seconds_are_billed_outside_the_spot_coefficient() -> None:
    spot = PricingConfig(mode="spot", input_per_mtok=1.0, spot_multiplier=0.5, gpu_class="l4")
    usage = UsageQuantities(prompt_tokens=1_000_000, web_searches=3, code_seconds=2.5)
    tools = ToolPrices(per_search=0.01, per_code_second=0.002)
    assert cost_of(price_applied(spot), usage, tools) == pytest.approx(0.5 + 0.03 + 0.005)
    assert cost_of(price_applied(spot), usage) == pytest.approx(0.5)
