"""An in-process gateway (scripted heads) whose batch worker the tests drive by hand,
on SQLite and PostgreSQL, with a clock the tests move."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve_app.batches.worker import BatchWorker
from serve_app.billing.records import UsageRecord
from serve_app.billing.store import LedgerStore
from serve_app.storage.db import Database
from tests.fixtures.gateway import GatewayHarness, add_keys, build_harness, start_heads


class Clock:
    """A manual clock: tests move it past leases and completion windows."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class BatchHarness:
    gw: GatewayHarness
    clock: Clock
    database: Database

    @property
    def worker(self) -> BatchWorker:
        worker = self.gw.app.state.gateway.batch_worker
        assert worker is not None
        return worker

    def client(self, who: str = "user") -> httpx.AsyncClient:
        return self.gw.client(self.gw.keys[who])

    def worker_named(self, worker_id: str) -> BatchWorker:
        """Another worker over the same stores and services (a second replica's)."""
        main = self.worker
        return BatchWorker(
            main.store,
            main.files,
            main.objects,
            main.catalog,
            main.principals,
            main.services,
            main.metering,
            main.options,
            clock=self.clock,
            worker_id=worker_id,
            accounts_generation=main._accounts_generation,
        )

    async def upload(self, lines: list[Any], who: str = "user") -> str:
        content = "".join(
            (line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines
        )
        async with self.client(who) as http:
            answer = await http.post(
                "/v1/files",
                files={"file": ("input.jsonl", content.encode(), "application/jsonl")},
                data={"purpose": "batch"},
            )
        assert answer.status_code == 200, answer.text
        file_id: str = answer.json()["id"]
        return file_id

    async def create(
        self, lines: list[Any], endpoint: str = "/v1/chat/completions", who: str = "user"
    ) -> dict[str, Any]:
        file_id = await self.upload(lines, who)
        async with self.client(who) as http:
            answer = await http.post(
                "/v1/batches",
                json={
                    "input_file_id": file_id,
                    "endpoint": endpoint,
                    "completion_window": "24h",
                    "metadata": {"purpose": "test"},
                },
            )
        assert answer.status_code == 200, answer.text
        batch: dict[str, Any] = answer.json()
        return batch

    async def get(self, batch_id: str, who: str = "user") -> dict[str, Any]:
        async with self.client(who) as http:
            answer = await http.get(f"/v1/batches/{batch_id}")
        assert answer.status_code == 200, answer.text
        batch: dict[str, Any] = answer.json()
        return batch

    async def content(self, file_id: str | None, who: str = "user") -> list[dict[str, Any]]:
        if file_id is None:
            return []
        async with self.client(who) as http:
            answer = await http.get(f"/v1/files/{file_id}/content")
        assert answer.status_code == 200, answer.text
        return [json.loads(line) for line in answer.text.splitlines()]

    def ledger(self) -> list[UsageRecord]:
        user = self.gw.store.get_user("alice")
        assert user is not None
        return LedgerStore(self.database).records_for(user.id)


def chat_line(custom_id: str, content: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "scripted-chat",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 4,
            **extra,
        },
    }


async def make_batch_harness(
    tmp_path: Path,
    database_url: str,
    args: dict[str, Any] | None = None,
    pooling_heads: dict[str, Any] | None = None,
) -> BatchHarness:
    folder = tmp_path / f"gw-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    gw = build_harness(
        folder / "gw.db", args, database_url=database_url, pooling_heads=pooling_heads
    )
    await start_heads(gw)
    add_keys(gw)
    clock = Clock()
    state = gw.app.state.gateway
    state.batches.clock = clock
    assert state.batch_worker is not None
    state.batch_worker.clock = clock
    return BatchHarness(gw, clock, Database(database_url))


@pytest.fixture
async def batches(tmp_path: Path, database_url: str) -> AsyncIterator[BatchHarness]:
    harness = await make_batch_harness(tmp_path, database_url)
    yield harness
    await harness.gw.aclose()
    harness.database.dispose()
