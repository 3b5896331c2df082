"""Usage records for ledger tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from serve_app.billing.pricing import build_record
from serve_app.billing.records import UsageQuantities, UsageRecord
from serve_app.catalog.config import PricingConfig


def make_record(request_id: str, **changes: Any) -> UsageRecord:
    values: dict[str, Any] = {
        "request_id": request_id,
        "created_at": datetime.now(UTC),
        "user_id": "usr_1",
        "key_id": "key_1",
        "org_id": "org_1",
        "model": "m1",
        "route": "chat",
        "status": "ok",
        "usage": UsageQuantities(prompt_tokens=10, completion_tokens=5),
        "pricing": PricingConfig(input_per_mtok=1.0, output_per_mtok=2.0),
    }
    values.update(changes)
    return build_record(**values)
