"""The real gateway app with dedicated endpoints on a fake Serve backend and a manual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve_app.auth.accounts import AccountStore
from serve_app.composition import build_state
from serve_app.config import GatewayAppArgs
from serve_app.dedicated.api.facade import Dedicated
from serve_app.inference.readiness import HeadReadiness
from serve_app.ingress.app import create_app
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database
from tests.unit.dedicated.fakes import FakeServeBackend

_CHAT: dict[str, Any] = {
    "head": "chat",
    "context_length": 4096,
    "max_output_tokens": 64,
    "engine": {"backend": "vllm", "config": {"model": "x", "max_model_len": 4096}},
    "deployment": {"max_ongoing_requests": 32},
}

CATALOG: list[dict[str, Any]] = [
    {"id": "ded-chat", **_CHAT},
    {"id": "ded-a10g", **_CHAT},
    {"id": "ded-mtp", **_CHAT},
    {"id": "ded-banned", **_CHAT},
    {"id": "ded-tts", "head": "speech", "output_modalities": ["audio"]},
    {
        "id": "ded-script",
        **_CHAT,
        "engine": {"backend": "tests.fakes.scripted_engine:ScriptedEngine", "config": {}},
    },
]

DEDICATED: dict[str, Any] = {
    "rate_card": {
        "applies_to_gpu_type": "l4",
        "hourly_by_gpu_type": {"l4": {"reserved": 1.2, "spot": 0.6}, "a10g": {"reserved": 0.9}},
        "unpriced_gpu_types": ["tpu"],
    },
    "default_gpu_type": "l4",
    "ineligible_models": ["ded-banned", "a", "b", "c"],
    "models": {
        "ded-a10g": {"gpu_type": "a10g"},
        "ded-mtp": {"speculative_depths": [2, 4], "queue_signal": True, "cards_per_replica": 2},
        "ded-script": {"offered_settings": ["max_num_seqs"]},
    },
    "cooldown_s": 600,
    "monthly_spend_cap": 50.0,
    "default_boot_seconds": 120,
}


class Clock:
    """A settable UTC clock shared by the service and the reconciler."""

    def __init__(self) -> None:
        self.now = datetime(2031, 5, 10, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class DedicatedHarness:
    app: Any
    store: AccountStore
    backend: FakeServeBackend
    dedicated: Dedicated
    clock: Clock
    keys: dict[str, str] = field(default_factory=dict)

    def client(self, key: str = "admin") -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://gateway.test",
            headers={"Authorization": f"Bearer {self.keys[key]}"},
        )

    def converge(self, boot: bool = False, seconds: float = 2.0) -> None:
        """Let time pass, run one reconcile (booting pending replicas first if asked)."""
        self.clock.advance(seconds)
        if boot:
            self.backend.boot()
        self.dedicated.converge_now()


def build(
    tmp_path: Path,
    dedicated: dict[str, Any] | None = None,
    catalog: list[dict[str, Any]] | None = None,
    **app_args: Any,
) -> DedicatedHarness:
    """The harness; ``dedicated`` overrides ``DEDICATED``, ``catalog`` ``CATALOG``,
    ``app_args`` other gateway args."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = GatewayAppArgs.model_validate(
        {
            "catalog": catalog or CATALOG,
            "dedicated": {**DEDICATED, **(dedicated or {})},
            **app_args,
        }
    )
    settings = GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'gw.db'}",
        auth_cache_seconds=0,
        state_dir=tmp_path,
        redis_url=None,
    )
    database = Database(settings.resolved_database_url())
    database.migrate()
    backend = FakeServeBackend()
    clock = Clock()
    state = build_state(
        config,
        {},
        HeadReadiness(None),
        database,
        settings,
        dedicated_backend=backend,
        clock=clock,
    )
    assert state.dedicated is not None
    store = AccountStore(database)
    harness = DedicatedHarness(
        app=create_app(state, config.max_body_bytes),
        store=store,
        backend=backend,
        dedicated=state.dedicated,
        clock=clock,
    )
    harness.keys["admin"] = store.create_key("ann", "acme", role="admin")
    harness.keys["member"] = store.create_key("mo", "acme")
    harness.keys["other"] = store.create_key("olga", "globex", role="admin")
    harness.keys["internal"] = store.create_key("ivan", "initech", role="admin")
    store.update_org("initech", internal=True)
    harness.keys["no_scope"] = store.create_key("nina", "acme", scopes=["inference"])
    return harness


@pytest.fixture
async def ded(tmp_path: Path) -> AsyncIterator[DedicatedHarness]:
    harness = build(tmp_path)
    yield harness
    await harness.dedicated.router.stop()
    await harness.app.state.gateway.text.metering.aclose()


def create_body(**overrides: Any) -> dict[str, Any]:
    return {
        "model_id": "ded-chat",
        "alias_slug": "my-bot",
        "mode": "spot",
        "min_replicas": 1,
        "max_replicas": 2,
        **overrides,
    }
