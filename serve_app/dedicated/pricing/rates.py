"""Prices of dedicated endpoints: the rate card, card-minutes and the mode-change quote.

Plain arithmetic with no I/O so the API's formulas (per-minute rate = hourly
/ 60 unrounded; estimated_cost of docs/reference/dedicated.md#mode-preview; minutes from replica
lifetimes) are tested exactly. A class a card has no rate for counts as zero and turns
``rate_matches_card`` false rather than failing the read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from serve_app.dedicated.options import CapacityClass, RateCardOptions
from serve_app.protocol.dedicated import CardHourly, DedicatedRateCard, Mode


def rate_per_card_minute(card: RateCardOptions, gpu_type: str, cls: CapacityClass) -> float | None:
    """EUR per card per minute, or None when the card is not priced for ``cls``."""
    if gpu_type in card.unpriced_gpu_types:
        return None
    rates = card.hourly_by_gpu_type.get(gpu_type)
    hourly = None if rates is None else getattr(rates, cls)
    return None if hourly is None else hourly / 60


def billed_classes(mode: Mode) -> tuple[CapacityClass, ...]:
    """Classes a mode bills at (hybrid: the reserved floor and the spot burst)."""
    if mode == "hybrid":
        return ("reserved", "spot")
    return ("reserved",) if mode == "reserved" else ("spot",)


def burst_class(mode: Mode) -> CapacityClass:
    """The class replicas beyond the floor run at."""
    return "reserved" if mode == "reserved" else "spot"


def mode_priced(card: RateCardOptions, gpu_type: str, mode: Mode) -> bool:
    return all(rate_per_card_minute(card, gpu_type, c) is not None for c in billed_classes(mode))


def estimated_cost(
    cards_per_replica: int,
    boot_seconds: float,
    replicas_reserved: int,
    replicas_spot: int,
    rate_reserved: float,
    rate_spot: float,
) -> float:
    """docs/reference/dedicated.md#mode-preview: cards x (boot / 60) x (reserved x reserved rate +
    spot x spot rate)."""
    return (
        cards_per_replica
        * (boot_seconds / 60)
        * (replicas_reserved * rate_reserved + replicas_spot * rate_spot)
    )


def rate_card_view(card: RateCardOptions, max_replicas_cap: int) -> DedicatedRateCard:
    """``GET /api/dedicated/rates`` for a caller whose organization has ``max_replicas_cap``."""
    head = card.applies_to_gpu_type
    return DedicatedRateCard(
        spot=rate_per_card_minute(card, head, "spot") or 0.0,
        reserved=rate_per_card_minute(card, head, "reserved") or 0.0,
        currency=card.currency,
        max_replicas_cap=max_replicas_cap,
        applies_to_gpu_type=head,
        hourly_by_gpu_type={
            name: CardHourly(reserved=rates.reserved, spot=rates.spot)
            for name, rates in card.hourly_by_gpu_type.items()
            if name not in card.unpriced_gpu_types
        },
        unpriced_gpu_types=list(card.unpriced_gpu_types),
    )


@dataclass(frozen=True)
class ReplicaSpan:
    """One replica's billed life: placed at ``start``, released at ``end`` (None: running)."""

    start: datetime
    end: datetime | None
    capacity_class: CapacityClass
    gpu_type: str
    cards: int


@dataclass(frozen=True)
class MonthUsage:
    minutes_reserved: float
    minutes_spot: float
    cost: float
    rate_matches_card: bool


def month_start(now: datetime) -> datetime:
    """00:00 UTC on the first day of ``now``'s month."""
    now = now.astimezone(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


RateHistory = Sequence[tuple[datetime, RateCardOptions]]
"""Cards with the time each took effect, oldest first (``DedicatedStore.rate_card_history``)."""


def month_usage(
    spans: Iterable[ReplicaSpan], card: RateCardOptions | RateHistory, now: datetime
) -> MonthUsage:
    """Replica-minutes of this month per class, and their cost at the rates in force.

    A span is clipped to [start of month, now]; minutes are replica-minutes
    (``month_minutes``) while the cost multiplies by the cards each replica held.
    With a rate history, each minute is priced at the card in force when it
    accrued (a span across a rate change is split at the change); minutes from
    before the first recorded card are priced at that first card.
    """
    history = [(_EARLIEST, card)] if isinstance(card, RateCardOptions) else list(card)
    begin = month_start(now)
    minutes: dict[CapacityClass, float] = {"reserved": 0.0, "spot": 0.0}
    cost = 0.0
    matches = True
    for span in spans:
        start = max(_utc(span.start), begin)
        end = min(_utc(span.end) if span.end else now, now)
        if end <= start:
            continue
        minutes[span.capacity_class] += (end - start).total_seconds() / 60
        for index, (effective, priced) in enumerate(history):
            piece_start = start if index == 0 else max(start, _utc(effective))
            piece_end = end if index + 1 == len(history) else min(end, _utc(history[index + 1][0]))
            if piece_end <= piece_start:
                continue
            rate = rate_per_card_minute(priced, span.gpu_type, span.capacity_class)
            if rate is None:
                matches = False
                continue
            cost += (piece_end - piece_start).total_seconds() / 60 * span.cards * rate
    return MonthUsage(minutes["reserved"], minutes["spot"], cost, matches)


_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)


def _utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; they were stored in UTC."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)
