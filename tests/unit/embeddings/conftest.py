"""Pooling heads for the in-process gateway: ``PoolingHeadCore`` around the scripted
engine (``tests/fakes/scripted_pooling.py``), whose vectors are known from the text.
Each test gets a fresh app, database and ledger."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from deployments.embeddings.head import PoolingHeadCore
from serve_app.heads.client import LocalPoolingClient, PoolingClient
from tests.fakes.scripted_pooling import ScriptedPoolingEngine
from tests.fixtures.gateway import CATALOG, GatewayHarness, add_keys, build_harness

EMBED = "scripted-embed"
MATRYOSHKA = "scripted-matryoshka"
RERANKER = "scripted-reranker"
SLOW = "scripted-slow-embed"
BROKEN = "scripted-broken-embed"
PRICE_PER_MTOK = 2.0


def _entry(model_id: str, config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": model_id,
        "head": "pooling",
        "output_modalities": ["embedding", "score"],
        "context_length": 32,
        "pooling": {"dimensions": 64, "score": "bi-encoder"},
        "pricing": {"mode": "fixed", "input_per_mtok": PRICE_PER_MTOK},
        "engine": {"backend": "scripted", "config": config},
        **extra,
    }


POOLING_CATALOG = [
    _entry(EMBED, {}),
    _entry(
        MATRYOSHKA,
        {"matryoshka": [16, 32]},
        pooling={"dimensions": 64, "matryoshka_dimensions": [16, 32], "score": "bi-encoder"},
    ),
    _entry(
        RERANKER,
        {"embeds": False},
        output_modalities=["score"],
        pooling={"score": "cross-encoder"},
    ),
    _entry(SLOW, {"delay_s": 5}),
    _entry(BROKEN, {"fail": True}),
]


@pytest.fixture
async def pooling_heads() -> dict[str, PoolingClient]:
    heads: dict[str, PoolingClient] = {}
    for entry in POOLING_CATALOG:
        core = PoolingHeadCore(ScriptedPoolingEngine(entry["engine"]["config"]))
        await core.start()
        heads[entry["id"]] = LocalPoolingClient(core)
    return heads


PoolingFactory = Callable[..., Awaitable[GatewayHarness]]


@pytest.fixture
async def make_pooling_gateway(
    tmp_path: Path, pooling_heads: dict[str, PoolingClient]
) -> AsyncIterator[PoolingFactory]:
    """``await make_pooling_gateway(embeddings={...})``: the app with the pooling heads."""
    made: list[GatewayHarness] = []

    async def make(**args: Any) -> GatewayHarness:
        folder = tmp_path / f"gw{len(made)}"
        folder.mkdir()
        catalog = [*CATALOG, *POOLING_CATALOG]
        harness = build_harness(
            folder / "gw.db", {"catalog": catalog, **args}, pooling_heads=pooling_heads
        )
        add_keys(harness)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        await harness.aclose()


@pytest.fixture
async def pool_gw(make_pooling_gateway: PoolingFactory) -> GatewayHarness:
    return await make_pooling_gateway()
