"""Usage metering: records, prices and the durable ledger (no Ray here)."""

from serve_app.billing.ledger import UsageLedger
from serve_app.billing.pricing import build_record, cost_of, price_applied
from serve_app.billing.records import PriceApplied, UsageQuantities, UsageRecord, UsageStatus
from serve_app.billing.store import LedgerStore, ModelTotals

__all__ = [
    "LedgerStore",
    "ModelTotals",
    "PriceApplied",
    "UsageLedger",
    "UsageQuantities",
    "UsageRecord",
    "UsageStatus",
    "build_record",
    "cost_of",
    "price_applied",
]
