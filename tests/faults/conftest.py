"""Fixtures of the fault suite: throwaway services and a gateway in production settings."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.services import PostgresServer, RedisServer, redis_binary, throwaway_postgres
from tests.fixtures.gateway import GatewayHarness, add_keys, build_harness, start_heads

PRODUCTION_AUTH_CACHE_S = 60.0
"""GATEWAY_AUTH_CACHE_SECONDS of configs/production.yaml."""


RPM = 100_000


def production_args(**limits: Any) -> dict[str, Any]:
    """configs/production.yaml's mode (limits fail closed unless told otherwise), with
    platform limits high enough for the load yet present, so every request is counted."""
    return {
        "deployment_mode": "production",
        "limits": {"rpm": RPM, "tpm": 10_000_000, "daily_tokens": 100_000_000, **limits},
    }


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(redis_binary())
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with throwaway_postgres() as server:
        yield server


@pytest.fixture
def postgres_database(postgres_server: PostgresServer) -> str:
    """A fresh database on the throwaway server (started again if a test left it down)."""
    if not postgres_server.running:
        postgres_server.start()
    return postgres_server.create_database(f"gw_fault_{uuid.uuid4().hex[:12]}")


ProductionGateway = Callable[..., Awaitable[GatewayHarness]]


@pytest.fixture
async def production_gateway(
    tmp_path: Path, redis_server: RedisServer, postgres_database: str
) -> AsyncIterator[ProductionGateway]:
    """``await production_gateway(**limits)``: a started gateway on the throwaway
    PostgreSQL and Redis, with the usual keys (``tests.fixtures.gateway.add_keys``)."""
    made: list[GatewayHarness] = []

    async def make(**limits: Any) -> GatewayHarness:
        harness = build_harness(
            tmp_path / "unused.db",
            production_args(**limits),
            auth_cache_seconds=PRODUCTION_AUTH_CACHE_S,
            database_url=postgres_database,
            redis_url=redis_server.url,
        )
        made.append(harness)
        await start_heads(harness)
        add_keys(harness)
        await harness.metering.start()
        return harness

    yield make
    for harness in made:
        state = harness.app.state.gateway
        await harness.aclose()
        await state.replays.aclose()
        await state.auth.aclose()
