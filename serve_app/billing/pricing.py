"""Prices from the catalog applied to usage.

- fixed: the list prices as written.
- spot: the list price is the spot price of the model's GPU class; it is scaled
  by the model-class coefficient (``spot_multiplier``), as published in the
  catalog (``spot_multiplier`` beside the list price).
- external: the list prices as written (the provider's price passed on).

A batch line (``serve_app.batches``) is billed at the catalog's price times the
batch discount (``batches.discount``, default 0.5); the record keeps both the list
prices and the discount, and names its batch.

Cached prompt tokens are billed like any prompt token (docs/reference/chat.md#usage). Web searches
and code-interpreter seconds are recorded as quantities; the catalog has no
unit price for them yet, so they add nothing to ``cost``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from serve_app.billing.records import PriceApplied, UsageQuantities, UsageRecord, UsageStatus
from serve_app.catalog.config import PricingConfig

COST_DECIMALS = 10


def price_applied(pricing: PricingConfig, batch_discount: float | None = None) -> PriceApplied:
    """The catalog's price as recorded with each request (and a batch line's discount)."""
    return PriceApplied(
        currency=pricing.currency,
        pricing_mode=pricing.mode,
        input_per_mtok=pricing.input_per_mtok,
        output_per_mtok=pricing.output_per_mtok,
        per_image=pricing.per_image,
        per_audio_second=pricing.per_audio_second,
        spot_multiplier=pricing.spot_multiplier if pricing.mode == "spot" else None,
        per_video_second=pricing.per_video_second,
        batch_discount=batch_discount,
    )


@dataclass(frozen=True)
class ToolPrices:
    """Platform prices of server tools (config ``tools:``), the same for every model."""

    per_search: float = 0.0
    per_code_second: float = 0.0


NO_TOOL_PRICES = ToolPrices()


def cost_of(
    price: PriceApplied, usage: UsageQuantities, tools: ToolPrices = NO_TOOL_PRICES
) -> float:
    """What ``usage`` costs at ``price``, in ``price.currency``.

    Tool use is added after the spot coefficient and the batch discount: searches
    and sandbox seconds are not GPU work, so neither the model class nor running on
    idle capacity scales them.
    """
    amount = (
        usage.prompt_tokens * price.input_per_mtok / 1_000_000
        + usage.completion_tokens * price.output_per_mtok / 1_000_000
        + usage.images * (price.per_image or 0.0)
        + usage.audio_seconds * (price.per_audio_second or 0.0)
        + usage.video_seconds * (price.per_video_second or 0.0)
    )
    if price.pricing_mode == "spot" and price.spot_multiplier is not None:
        amount *= price.spot_multiplier
    if price.batch_discount is not None:
        amount *= price.batch_discount
    amount += usage.web_searches * tools.per_search + usage.code_seconds * tools.per_code_second
    return round(amount, COST_DECIMALS)


def build_record(
    *,
    request_id: str,
    created_at: datetime,
    user_id: str,
    key_id: str,
    org_id: str,
    model: str,
    route: str,
    status: UsageStatus,
    usage: UsageQuantities,
    pricing: PricingConfig,
    tool_prices: ToolPrices = NO_TOOL_PRICES,
    batch_id: str | None = None,
    batch_discount: float | None = None,
) -> UsageRecord:
    """A ledger record with the price applied now (a batch line's: discounted)."""
    price = price_applied(pricing, batch_discount)
    return UsageRecord(
        request_id=request_id,
        created_at=created_at,
        user_id=user_id,
        key_id=key_id,
        org_id=org_id,
        model=model,
        route=route,
        status=status,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_tokens=usage.cached_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        requests=usage.requests,
        web_searches=usage.web_searches,
        code_seconds=usage.code_seconds,
        images=usage.images,
        audio_seconds=usage.audio_seconds,
        currency=price.currency,
        pricing_mode=price.pricing_mode,
        input_per_mtok=price.input_per_mtok,
        output_per_mtok=price.output_per_mtok,
        per_image=price.per_image,
        per_audio_second=price.per_audio_second,
        spot_multiplier=price.spot_multiplier,
        cost=cost_of(price, usage, tool_prices),
        video_seconds=usage.video_seconds,
        per_video_second=price.per_video_second,
        batch_id=batch_id,
        batch_discount=price.batch_discount,
    )
