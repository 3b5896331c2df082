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


CHAT = CatalogModel.model_validate(
    {"id": "m", "head": "chat", "context_length": 64, "max_output_tokens": 32}
)
EMBED = CatalogModel.model_validate(
    {
        "id": "e",
        "head": "pooling",
        "output_modalities": ["embedding"],
        "context_length": 512,
        "pooling": {"dimensions": 384, "matryoshka_dimensions": [64]},
    }
)


def _size(value: dict[str, object]) -> int:
    return math.ceil(len(json.dumps(value)) / 4)


def test_a_lines_estimate_counts_its_output_cap() -> None:
    body: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}
    chat = "/v1/chat/completions"
    assert estimate_tokens(chat, body, CHAT) == _size(body) + 32  # the model's cap
    capped = {**body, "max_tokens": 2, "n": 3}
    assert estimate_tokens(chat, capped, CHAT) == _size(capped) + 2 * 3
    both = {**body, "max_tokens": 2, "max_completion_tokens": 7}  # the route reads the latter
    assert estimate_tokens(chat, both, CHAT) == _size(both) + 7
    responses = {"model": "m", "input": "hi", "max_output_tokens": 5}
    assert estimate_tokens("/v1/responses", responses, CHAT) == _size(responses) + 5


def test_n_and_max_tokens_count_as_the_route_reads_them() -> None:
    """``"n": 16.0`` is 16 answers on the route; it counted 1 when the raw dict was read."""
    body: dict[str, object] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 16.0,
        "max_tokens": 4.0,
        "temperature": 1,
    }
    assert estimate_tokens("/v1/chat/completions", body, CHAT) == _size(body) + 4 * 16


def test_every_prompt_of_a_completions_list_counts() -> None:
    body: dict[str, object] = {"model": "m", "prompt": ["a", "b", "c"], "max_tokens": 10, "n": 2}
    assert estimate_tokens("/v1/completions", body, CHAT) == _size(body) + 10 * 2 * 3
    one = {**body, "prompt": "a"}
    assert estimate_tokens("/v1/completions", one, CHAT) == _size(one) + 10 * 2


def test_an_embeddings_line_counts_its_inputs_and_its_answer() -> None:
    """2,048 one-character inputs: a small line whose answer holds 2,048 x 384 numbers."""
    body: dict[str, object] = {"model": "e", "input": ["a"] * 2048}
    assert estimate_tokens("/v1/embeddings", body, EMBED) == 2048 * (1 + 2) + 2048 * 384
    smaller = {**body, "dimensions": 64.0}
    assert estimate_tokens("/v1/embeddings", smaller, EMBED) == 2048 * 3 + 2048 * 64
    ids = {"model": "e", "input": [[1, 2, 3], [4, 5]]}
    assert estimate_tokens("/v1/embeddings", ids, EMBED) == 5 + 2 * 384


def test_a_line_the_route_refuses_counts_its_size_only() -> None:
    streamed = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    assert estimate_tokens("/v1/chat/completions", streamed, CHAT) == _size(streamed)
    wrong = {"model": "m", "messages": "not a list", "n": 16}
    assert estimate_tokens("/v1/chat/completions", wrong, CHAT) == _size(wrong)


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
