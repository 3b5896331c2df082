"""The endpoint table and the published enum agree; a line's token estimate; the
ledger's totals keep batch lines apart from live requests."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import get_args

from serve_app.batches.endpoints import ENDPOINTS, estimate_tokens
from serve_app.billing.pricing import build_record
from serve_app.billing.records import UsageQuantities
from serve_app.billing.store import LedgerStore
from serve_app.catalog.config import CatalogModel, PricingConfig
from serve_app.protocol.batches import BatchEndpointUrl
from serve_app.storage.db import Database
from tests.fixtures.gateway import GatewayHarness


def test_every_published_endpoint_has_an_entry() -> None:
    assert set(get_args(BatchEndpointUrl)) == set(ENDPOINTS)


def test_a_lines_estimate_counts_its_output_cap() -> None:
    model = CatalogModel.model_validate(
        {"id": "m", "head": "chat", "context_length": 64, "max_output_tokens": 32}
    )
    body: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}

    def prompt(value: dict[str, object]) -> int:
        return math.ceil(len(json.dumps(value)) / 4)

    assert estimate_tokens(body, model) == prompt(body) + 32  # the model's cap
    capped = {**body, "max_tokens": 2, "n": 3}
    assert estimate_tokens(capped, model) == prompt(capped) + 2 * 3
    responses = {**body, "max_output_tokens": 5}
    assert estimate_tokens(responses, model) == prompt(responses) + 5


def test_totals_keep_batch_lines_apart(db: Database) -> None:
    pricing = PricingConfig.model_validate({"mode": "fixed", "input_per_mtok": 2.0})
    common = {
        "created_at": datetime.now(UTC),
        "user_id": "u1",
        "key_id": "k1",
        "org_id": "o1",
        "model": "m",
        "route": "chat",
        "status": "ok",
        "usage": UsageQuantities(prompt_tokens=1_000_000),
        "pricing": pricing,
    }
    live = build_record(request_id="live", **common)  # type: ignore[arg-type]
    batch = build_record(  # type: ignore[arg-type]
        request_id="batch_req_1", batch_id="batch_1", batch_discount=0.5, **common
    )
    assert live.cost == 2.0 and batch.cost == 1.0
    LedgerStore(db).insert([live, batch, batch])
    totals = LedgerStore(db).totals("u1")
    assert [(t.batch, t.records, t.cost) for t in totals] == [(False, 1, 2.0), (True, 1, 1.0)]


async def test_the_openapi_lists_cancels_409(gateway: GatewayHarness) -> None:
    """``POST /v1/batches/{id}/cancel`` answers 409 ``batch_not_cancellable`` on an ended
    batch; the published document says so (schemathesis found it unlisted)."""
    async with gateway.client() as http:
        document = (await http.get("/openapi.json")).json()
    answers = document["paths"]["/v1/batches/{batch_id}/cancel"]["post"]["responses"]
    assert "batch_not_cancellable" in answers["409"]["description"]
    schema = answers["409"]["content"]["application/json"]["schema"]
    assert schema == answers["404"]["content"]["application/json"]["schema"]  # the envelope
