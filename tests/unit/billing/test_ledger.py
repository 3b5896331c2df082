"""The usage ledger on SQLite and PostgreSQL: off the hot path, durable, never twice."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from serve_app.billing.ledger import UsageLedger
from serve_app.billing.records import UsageQuantities
from serve_app.billing.store import LedgerStore
from serve_app.catalog.config import PricingConfig
from serve_app.storage.db import Database
from serve_app.storage.schema import usage_records
from tests.fixtures.waiting import until
from tests.unit.billing.records import make_record

REPO_ROOT = Path(__file__).resolve().parents[3]


def stored_ids(db: Database) -> list[str]:
    with db.connect() as conn:
        return sorted(conn.execute(sa.select(usage_records.c.request_id)).scalars())


def spool_files(spool: Path) -> list[str]:
    return sorted(p.name for p in spool.glob("*.jsonl"))


async def test_submit_spools_and_the_flusher_commits(db: Database, tmp_path: Path) -> None:
    ledger = UsageLedger(LedgerStore(db), tmp_path / "spool", flush_interval_s=3600)
    record = make_record("req-1")
    ledger.submit(record)
    # Acknowledged: on disk, not yet in SQL (no database round trip on the request path).
    assert stored_ids(db) == []
    assert len((tmp_path / "spool").glob("*.active.jsonl").__next__().read_text().splitlines()) == 1
    assert await ledger.flush()
    assert stored_ids(db) == ["req-1"]
    assert LedgerStore(db).get("req-1") is not None
    await ledger.aclose()
    assert list((tmp_path / "spool").iterdir()) == []


async def test_a_request_id_is_stored_once(db: Database, tmp_path: Path) -> None:
    store = LedgerStore(db)
    ledger = UsageLedger(store, tmp_path / "spool")
    first = make_record("req-1")
    ledger.submit(first)
    ledger.submit(make_record("req-1", usage=UsageQuantities(prompt_tokens=999)))
    await ledger.flush()
    store.insert([first, first])
    await ledger.aclose()
    assert stored_ids(db) == ["req-1"]
    kept = store.get("req-1")
    assert kept is not None and kept.prompt_tokens == 10  # the first write wins


async def test_a_full_batch_wakes_the_flusher(db: Database, tmp_path: Path) -> None:
    ledger = UsageLedger(LedgerStore(db), tmp_path / "spool", flush_interval_s=3600, batch_size=50)
    await ledger.start()
    for i in range(120):
        ledger.submit(make_record(f"req-{i:03d}"))
    await until(lambda: len(stored_ids(db)) >= 100, every_s=0.02)  # two full batches, no hour
    await ledger.aclose()
    assert len(stored_ids(db)) == 120


def run_child(
    database_url: str, spool: Path, mode: str, count: int
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.unit.billing.spool_child",
            database_url,
            str(spool),
            mode,
            str(count),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


async def test_replica_killed_before_commit_loses_nothing(
    database_url: str, db: Database, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    child = run_child(database_url, spool, "before-commit", 25)
    assert child.returncode == -9, child.stderr
    assert child.stdout.split() == ["spooled"]
    assert stored_ids(db) == []  # the transaction died with the process
    assert spool_files(spool)  # what was acknowledged is still on disk
    successor = UsageLedger(LedgerStore(db), spool, flush_interval_s=3600)
    await successor.start()  # adopts the dead replica's files
    await successor.flush()
    await successor.aclose()
    assert stored_ids(db) == sorted(f"req-{i}" for i in range(25))
    assert list(spool.iterdir()) == []


async def test_replica_killed_after_commit_is_not_billed_twice(
    database_url: str, db: Database, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    child = run_child(database_url, spool, "after-commit", 25)
    assert child.returncode == -9, child.stderr
    assert len(stored_ids(db)) == 25
    assert spool_files(spool)  # committed, but the file was never deleted
    successor = UsageLedger(LedgerStore(db), spool)
    await successor.start()
    await successor.flush()
    await successor.aclose()
    with db.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(usage_records)).scalar() == 25
    assert list(spool.iterdir()) == []


async def test_a_live_ledger_keeps_its_files(db: Database, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    alive = UsageLedger(LedgerStore(db), spool, flush_interval_s=3600)
    # Submitted from a thread without a loop: its flusher is not running yet.
    await asyncio.to_thread(alive.submit, make_record("mine"))
    assert spool_files(spool)
    other = UsageLedger(LedgerStore(db), spool, flush_interval_s=3600)
    await other.start()
    await other.flush()
    assert stored_ids(db) == []  # not adopted: its owner still holds the lock
    await alive.aclose()
    await other.aclose()
    assert stored_ids(db) == ["mine"]


async def test_database_outage_only_delays_records(db: Database, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    missing = Database(f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}")
    down = UsageLedger(LedgerStore(missing), spool, flush_interval_s=3600)
    down.submit(make_record("req-1"))
    assert not await down.flush()
    await down.aclose()  # cannot commit: the files stay behind
    assert spool_files(spool)
    back = UsageLedger(LedgerStore(db), spool)
    await back.start()
    await back.flush()
    await back.aclose()
    assert stored_ids(db) == ["req-1"]


def test_totals_per_model_since_a_date(db: Database) -> None:
    store = LedgerStore(db)
    old = datetime.now(UTC) - timedelta(days=10)
    spot = PricingConfig(
        mode="spot", input_per_mtok=2.0, output_per_mtok=4.0, spot_multiplier=0.5, gpu_class="l4"
    )
    store.insert(
        [
            make_record("a", usage=UsageQuantities(prompt_tokens=100, completion_tokens=50)),
            make_record(
                "b", usage=UsageQuantities(prompt_tokens=10, completion_tokens=5, requests=3)
            ),
            make_record("c", model="m2", pricing=spot, usage=UsageQuantities(prompt_tokens=1000)),
            make_record("d", created_at=old),
            make_record("e", user_id="usr_2"),
        ]
    )
    totals = {t.model: t for t in store.totals("usr_1", since=old + timedelta(days=1))}
    assert set(totals) == {"m1", "m2"}
    m1 = totals["m1"]
    assert (m1.records, m1.requests, m1.prompt_tokens, m1.completion_tokens) == (2, 4, 110, 55)
    assert abs(m1.cost - (110 * 1.0 + 55 * 2.0) / 1e6) < 1e-12
    assert abs(totals["m2"].cost - 1000 * 2.0 * 0.5 / 1e6) < 1e-12
    assert {t.model: t.records for t in store.totals("usr_1")} == {"m1": 3, "m2": 1}


async def test_an_unreadable_spool_file_does_not_block_the_others(
    db: Database, tmp_path: Path
) -> None:
    """A file this version cannot store (here: a field from a newer version) stays in
    the spool for a process that can, while every other record is committed."""
    spool = tmp_path / "spool"
    spool.mkdir()
    # A dead replica's files (spool.py): its unlocked lock file and its active records,
    # the second written by a newer version with a field this one does not know.
    future = make_record("new-1").to_json() | {"gpu_seconds": 1.5}
    lines = [json.dumps(make_record("old-1").to_json()), json.dumps(future)]
    (spool / "gone-1.lock").touch()
    (spool / "gone-1.active.jsonl").write_text("\n".join(lines) + "\n")
    ledger = UsageLedger(LedgerStore(db), spool, flush_interval_s=3600)
    await ledger.start()
    ledger.submit(make_record("mine-1"))
    await ledger.flush()
    ledger.submit(make_record("mine-2"))
    assert await ledger.flush()
    assert stored_ids(db) == ["mine-1", "mine-2", "old-1"]  # the bad record blocks nothing
    await ledger.aclose()
    kept = [line for path in spool.glob("*.jsonl") for line in path.read_text().splitlines()]
    assert len(kept) == 1 and "gpu_seconds" in kept[0]  # kept whole for a newer replica
    successor = UsageLedger(LedgerStore(db), spool, flush_interval_s=3600)
    await successor.start()
    await successor.flush()  # adopts the held file (its owner is gone), holds it again
    await successor.aclose()
    assert stored_ids(db) == ["mine-1", "mine-2", "old-1"]
    assert len(list(spool.glob("*.jsonl"))) == 1


async def test_a_record_the_database_refuses_is_set_aside_alone(
    db: Database, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    ledger = UsageLedger(LedgerStore(db), spool, flush_interval_s=3600)
    ledger.submit(make_record("good-1"))
    ledger.submit(make_record("bad-1", status="refunded"))  # fails the status CHECK
    ledger.submit(make_record("good-2"))
    assert await ledger.flush()
    assert stored_ids(db) == ["good-1", "good-2"]
    await ledger.aclose()
    (kept,) = [line for path in spool.glob("*.jsonl") for line in path.read_text().splitlines()]
    assert json.loads(kept)["request_id"] == "bad-1"


async def test_files_whose_lock_file_is_gone_are_adopted(db: Database, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "host.a-1-x.0000000003.batch.jsonl").write_text(
        json.dumps(make_record("batch-1").to_json()) + "\n"
    )
    (spool / "host.a-1-x.active.jsonl").write_text(
        json.dumps(make_record("active-1").to_json()) + "\n"
    )
    ledger = UsageLedger(LedgerStore(db), spool, flush_interval_s=3600)
    await ledger.start()
    assert await ledger.flush()
    await ledger.aclose()
    assert stored_ids(db) == ["active-1", "batch-1"]
    assert list(spool.iterdir()) == []
