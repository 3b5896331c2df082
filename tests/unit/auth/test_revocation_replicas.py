"""Revocation and account changes reach every gateway replica at once (issue 16).

Replicas are separate app instances sharing one SQLite file (and Redis where
configured), each with its own auth cache that would trust a key for a minute.
Changes are made by the real ``gateway`` CLI in another process, so nothing in
this process is told about them: only Redis or the database can carry them.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from serve_app.auth.accounts import AccountStore
from serve_app.auth.epoch import DB_POLL_INTERVAL_S, EpochWatch
from serve_app.auth.service import AuthService
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database
from tests.fixtures.gateway import GatewayHarness, add_keys, build_harness, start_heads
from tests.fixtures.limits import REDIS_URL

REPO_ROOT = Path(__file__).resolve().parents[3]
CHAT = {"model": "scripted-chat", "messages": [{"role": "user", "content": "hi"}]}
EXTERNAL = {**CHAT, "model": "external-chat"}
REPLICAS = 3


def gateway_cli(db_path: Path, redis_url: str | None, *argv: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(
        GATEWAY_DATABASE_URL=f"sqlite:///{db_path}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    if redis_url:
        env["GATEWAY_REDIS_URL"] = redis_url
    done = subprocess.run(
        [sys.executable, "-m", "serve_app.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


async def status(replica: GatewayHarness, key: str, body: dict[str, object] = CHAT) -> int:
    async with replica.client(key) as http:
        return (await http.post("/v1/chat/completions", json=body)).status_code


async def _replicas(tmp_path: Path, redis_url: str | None) -> AsyncIterator[list[GatewayHarness]]:
    db_path = tmp_path / "shared.db"
    made = []
    for _ in range(REPLICAS):
        replica = build_harness(db_path, auth_cache_seconds=60)
        # The replica's watch as build_state makes it, with Redis when configured. The
        # database poll is slowed to an hour where Redis is under test, so only Redis
        # can carry the change in time.
        database = Database(f"sqlite:///{db_path}")
        watch = EpochWatch.build(database, redis_url)
        if redis_url:
            watch._poll_s = 3600
        replica.app.state.gateway.auth = AuthService(
            AccountStore(database),
            GatewaySettings(auth_cache_seconds=60, redis_url=redis_url),
            epochs=watch,
        )
        await start_heads(replica)
        made.append(replica)
    add_keys(made[0])
    for replica in made[1:]:
        replica.keys = made[0].keys
    yield made
    for replica in made:
        await replica.app.state.gateway.auth.aclose()
        await replica.aclose()


@pytest.fixture
async def redis_replicas(tmp_path: Path) -> AsyncIterator[list[GatewayHarness]]:
    async for made in _replicas(tmp_path, REDIS_URL):
        yield made


@pytest.fixture
async def sqlite_replicas(tmp_path: Path) -> AsyncIterator[list[GatewayHarness]]:
    async for made in _replicas(tmp_path, None):
        yield made


async def test_cli_revocation_is_seen_by_every_replica_through_redis(
    tmp_path: Path, redis_replicas: list[GatewayHarness]
) -> None:
    key = redis_replicas[0].keys["user"]
    assert [await status(r, key) for r in redis_replicas] == [200] * REPLICAS  # all cached
    await asyncio.to_thread(gateway_cli, tmp_path / "shared.db", REDIS_URL, "keys", "revoke", key)
    # At once, on every replica, with caches that would have trusted the key for a minute.
    assert [await status(r, key) for r in redis_replicas] == [401] * REPLICAS


async def test_org_switch_is_seen_by_every_replica_through_redis(
    tmp_path: Path, redis_replicas: list[GatewayHarness]
) -> None:
    key = redis_replicas[0].keys["external"]
    before = [await status(r, key, EXTERNAL) for r in redis_replicas]
    assert 403 not in before  # allowed (the unreachable provider answers 502/503)
    await asyncio.to_thread(
        gateway_cli,
        tmp_path / "shared.db",
        REDIS_URL,
        "orgs",
        "update",
        "ext-org",
        "--external-providers",
        "off",
    )
    assert [await status(r, key, EXTERNAL) for r in redis_replicas] == [403] * REPLICAS


async def test_without_redis_the_database_carries_it_within_100_ms(
    tmp_path: Path, sqlite_replicas: list[GatewayHarness]
) -> None:
    key = sqlite_replicas[0].keys["user"]
    assert [await status(r, key) for r in sqlite_replicas] == [200] * REPLICAS
    await asyncio.to_thread(gateway_cli, tmp_path / "shared.db", None, "keys", "revoke", key)
    # Two poll intervals (100 ms): past them a replica's value is stale and the request reads
    # the database itself, so a slower machine only makes the read more certain; no upper
    # window of the machine's speed is asserted.
    await asyncio.sleep(2 * DB_POLL_INTERVAL_S)
    assert [await status(r, key) for r in sqlite_replicas] == [401] * REPLICAS


async def test_in_process_change_is_seen_on_the_next_request(
    sqlite_replicas: list[GatewayHarness],
) -> None:
    key = sqlite_replicas[0].keys["user"]
    assert [await status(r, key) for r in sqlite_replicas] == [200] * REPLICAS
    sqlite_replicas[1].store.revoke_key(key)  # the single-process default's path
    assert [await status(r, key) for r in sqlite_replicas] == [401] * REPLICAS


async def test_the_cache_still_spares_the_database(tmp_path: Path) -> None:
    """Without a change, the generation check does not turn into a lookup per request."""
    replica = build_harness(tmp_path / "one.db", auth_cache_seconds=60)
    await start_heads(replica)
    add_keys(replica)
    auth = replica.app.state.gateway.auth
    lookups = 0
    store = auth._store
    find = store.find_key

    def counting(key_hash: str):  # type: ignore[no-untyped-def]
        nonlocal lookups
        lookups += 1
        return find(key_hash)

    store.find_key = counting
    for _ in range(5):
        assert await status(replica, replica.keys["user"]) == 200
    assert lookups == 1
    await replica.aclose()
