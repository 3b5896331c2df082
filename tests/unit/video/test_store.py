"""``JobStore`` on SQLite and PostgreSQL: the atomic per-user cap, claims, billing once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from serve_app.billing.store import LedgerStore
from serve_app.catalog.config import PricingConfig
from serve_app.jobs.records import QUEUED, JobOwner, VideoJob, new_job_id
from serve_app.jobs.store import JobStore
from serve_app.storage.db import Database

PRICING = PricingConfig(per_video_second=0.02).model_dump_json()


def _in_org(user: str, org: str = "org") -> JobOwner:
    return JobOwner(user_id=user, org_id=org)


def job_for(
    user: str, model: str = "m", created_at: datetime | None = None, org: str = "org"
) -> VideoJob:
    return VideoJob(
        id=new_job_id(),
        user_id=user,
        key_id=f"key-{user}",
        org_id=org,
        model=model,
        status=QUEUED,
        prompt="a cat",
        negative_prompt=None,
        width=None,
        height=None,
        num_frames=9,
        fps=None,
        num_inference_steps=None,
        seed=7,
        pricing=PRICING,
        created_at=created_at or datetime.now(UTC),
    )


def run_together(count: int, action: Callable[[int], object]) -> list[object]:
    """Start ``count`` threads on one barrier so their statements really overlap."""
    barrier = threading.Barrier(count)
    results: list[object] = [None] * count
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = action(index)
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    return results


@pytest.fixture
def replicas(database_url: str) -> Iterator[list[Database]]:
    """Three migrated ``Database`` objects on one database: three processes' pools."""
    databases = [Database(database_url) for _ in range(3)]
    databases[0].migrate()
    yield databases
    for database in databases:
        database.dispose()


def test_the_cap_holds_under_concurrent_creates(replicas: list[Database]) -> None:
    stores = [JobStore(db) for db in replicas]
    attempts = 12
    created = run_together(
        attempts, lambda i: stores[i % len(stores)].create(job_for("alice"), 2, 60)
    )
    assert created.count(True) == 2
    assert len(stores[0].list_recent(_in_org("alice"), 50)) == 2
    # Other users have their own cap, also under contention.
    others = run_together(6, lambda i: stores[i % 3].create(job_for(f"user{i % 2}"), 2, 60))
    assert others.count(True) == 4


def test_finished_jobs_free_the_cap(db: Database) -> None:
    store = JobStore(db)
    first, second = job_for("alice"), job_for("alice")
    assert store.create(first, 2, 60) and store.create(second, 2, 60)
    assert not store.create(job_for("alice"), 2, 60)
    cancelled = store.cancel(first.id, _in_org("alice"))
    assert cancelled is not None and cancelled.status == "cancelled"
    assert store.create(job_for("alice"), 2, 60)


def test_each_queued_job_is_claimed_by_exactly_one_worker(replicas: list[Database]) -> None:
    setup = JobStore(replicas[0])
    jobs = [job_for(f"user{i}") for i in range(4)]
    for job in jobs:
        assert setup.create(job, 2, 60)
    stores = [JobStore(db) for db in replicas]
    claims = run_together(6, lambda i: stores[i % 3].claim_next("m", f"worker{i}"))
    claimed = [c.id for c in claims if isinstance(c, VideoJob)]
    assert sorted(claimed) == sorted(job.id for job in jobs)  # each once, none lost
    running = [setup.get(job.id) for job in jobs]
    assert all(j is not None and j.status == "running" for j in running)
    assert setup.claim_next("m", "late") is None


def test_completion_bills_once_and_only_for_the_claiming_worker(db: Database) -> None:
    store = JobStore(db)
    job = job_for("alice")
    store.create(job, 2, 60)
    claimed = store.claim_next("m", "w1")
    assert claimed is not None and claimed.id == job.id
    assert not store.complete(claimed, "w2", "videos/x.mp4", 2.0, 1.0)  # not its job
    assert store.complete(claimed, "w1", "videos/x.mp4", 2.0, 1.0)
    assert not store.complete(claimed, "w1", "videos/x.mp4", 2.0, 1.0)  # already done
    ledger = LedgerStore(db)
    record = ledger.get(job.id)
    assert record is not None
    assert (record.route, record.video_seconds, record.per_video_second) == ("video", 2.0, 0.02)
    assert record.cost == pytest.approx(0.04)
    assert len(ledger.records_for("alice")) == 1
    assert store.cancel(job.id, _in_org("alice")).status == "completed"  # type: ignore[union-attr]


def test_a_cancelled_job_cannot_be_completed_or_failed(db: Database) -> None:
    store = JobStore(db)
    job = job_for("alice")
    store.create(job, 2, 60)
    claimed = store.claim_next("m", "w1")
    assert claimed is not None
    store.cancel(job.id, _in_org("alice"))
    assert not store.heartbeat(job.id, "w1")
    assert not store.complete(claimed, "w1", "videos/x.mp4", 1.0, 1.0)
    assert not store.fail(job.id, "w1", "boom")
    assert store.get(job.id).status == "cancelled"  # type: ignore[union-attr]
    assert LedgerStore(db).get(job.id) is None


def test_stale_running_jobs_are_failed_and_fresh_ones_kept(db: Database) -> None:
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    dead_worker = JobStore(db, clock=lambda: hour_ago)
    live = JobStore(db)
    stale, fresh = job_for("alice"), job_for("bob")
    live.create(stale, 2, 60)
    live.create(fresh, 2, 60)
    assert dead_worker.claim_next("m", "dead") is not None  # heartbeat an hour old
    assert live.claim_next("m", "alive") is not None
    assert live.fail_stale(60) == 1
    failed = live.get(stale.id)
    assert failed is not None and failed.status == "failed"
    assert failed.error is not None and "stopped responding" in failed.error
    assert live.get(fresh.id).status == "running"  # type: ignore[union-attr]


def test_list_is_newest_first_and_per_user(db: Database) -> None:
    store = JobStore(db)
    start = datetime.now(UTC)
    ids = []
    for minute in range(5):
        job = job_for("alice", created_at=start + timedelta(minutes=minute))
        store.create(job, 10, 60)
        ids.append(job.id)
    store.create(job_for("bob"), 10, 60)
    assert [j.id for j in store.list_recent(_in_org("alice"), 3)] == ids[::-1][:3]
    assert (
        store.get(ids[0], _in_org("bob")) is None
        and store.get(ids[0], _in_org("alice")) is not None
    )


def test_jobs_are_the_organizations_they_were_made_in(db: Database) -> None:
    store = JobStore(db)
    job = job_for("alice", org="acme")
    store.create(job, 10, 60)
    elsewhere = _in_org("alice", "other-org")
    assert store.get(job.id, elsewhere) is None
    assert store.list_recent(elsewhere, 10) == []
    assert store.cancel(job.id, elsewhere) is None
    assert store.get(job.id, _in_org("alice", "acme")).status == "queued"  # type: ignore[union-attr]
    assert [j.id for j in store.list_recent(_in_org("alice", "acme"), 10)] == [job.id]
