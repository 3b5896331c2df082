"""Faults on the production stack while a 200-line batch (and live traffic) runs: nothing
lost, nothing run into the output or billed twice, and the limits fail the documented way.

Run after test_stack_e2e.py on the same stack; each test leaves it serving again.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime

import httpx
import psutil
import pytest
import sqlalchemy as sa

from tests.production.batches import (
    LINES,
    ClaimWatch,
    embedding_lines,
    line_states,
    output_lines,
    settle_ledger,
    submit,
    wait_both_workers,
    wait_terminal,
)
from tests.production.stack import (
    EMBED,
    GATEWAY_TITLE,
    ProductionStack,
    process_title,
    replica,
    wait_for,
    worker_pid,
)

pytestmark = [pytest.mark.production, pytest.mark.fault]

REDIS_DOWN_S = 20.0
POOLING_TITLE = f"ServeReplica:gateway:pooling-{EMBED}"
"""Ray's process title of the embeddings head's replica (its EngineCore is a child)."""


def _ended_whole(stack: ProductionStack, key: str, batch: dict[str, object], tag: str) -> None:
    """A completed batch: every line once in the output, one ledger row per line."""
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
    batch_id = str(batch["id"])
    lines = line_states(stack, batch_id)
    assert all(r.status == "succeeded" and r.has_result for r in lines)
    settle_ledger(stack, batch_id, LINES)
    outputs = output_lines(stack, key, batch["output_file_id"])  # type: ignore[arg-type]
    assert sorted(o["custom_id"] for o in outputs) == sorted(f"{tag}-{i}" for i in range(LINES))


def _stopped_partway(
    stack: ProductionStack, key: str, batch: dict[str, object], code: str, *, never_failed: bool
) -> None:
    """A batch stopped while its lines ran (cancelled, expired): the lines that started
    ended with their result, billed once and in the output; the rest never started and are
    in the error file as ``code``, counted in ``failed`` when ``never_failed``."""
    batch_id = str(batch["id"])
    lines = line_states(stack, batch_id)
    ran = [r for r in lines if r.attempts > 0]
    never = [r for r in lines if r.attempts == 0]
    assert 0 < len(ran) < LINES, len(ran)
    assert all(r.status == "succeeded" and r.has_result for r in ran)
    assert all(not r.has_result for r in never)
    counts = batch["request_counts"]
    failed = len(never) if never_failed else 0
    assert counts == {"total": LINES, "completed": len(ran), "failed": failed}, counts
    ledger = settle_ledger(stack, batch_id, len(ran))
    outputs = output_lines(stack, key, batch["output_file_id"])  # type: ignore[arg-type]
    assert sorted(o["custom_id"] for o in outputs) == sorted(r.custom_id for r in ran)
    assert {o["id"] for o in outputs} == {row.request_id for row in ledger}
    errors = output_lines(stack, key, batch["error_file_id"])  # type: ignore[arg-type]
    assert sorted(e["custom_id"] for e in errors) == sorted(r.custom_id for r in never)
    assert {e["error"]["code"] for e in errors} == {code}


def test_a_gateway_replica_killed_while_running_lines_loses_and_doubles_nothing(
    prod_stack: ProductionStack,
) -> None:
    key = prod_stack.key("kill-user")
    batch_id = submit(prod_stack, key, embedding_lines(LINES, "kill"))
    with ClaimWatch(prod_stack, batch_id) as watch:
        wait_both_workers(watch)
        victim = wait_for("a worker holding a running line", watch.running_owner, 30.0, 0.02)
        pid = worker_pid(victim)
        assert GATEWAY_TITLE in process_title(pid), (pid, process_title(pid))
        os.kill(pid, signal.SIGKILL)  # no stop hook runs: its lines keep their leases
        # What the dead worker held (nobody takes it before its lease passes, 15 s).
        held = {
            r.line
            for r in prod_stack.rows(
                "SELECT line FROM batch_lines WHERE batch_id = :b AND lease_owner = :w",
                b=batch_id,
                w=victim,
            )
        }
        done_at_kill = watch.done_lines
        batch = wait_terminal(prod_stack, key, batch_id)
    assert done_at_kill < LINES, "the batch ended before the kill"
    _ended_whole(prod_stack, key, batch, "kill")
    lines = {r.line: r for r in line_states(prod_stack, batch_id)}
    # The killed worker's lines were claimed again after their lease (at most one more
    # attempt each); every other line ran once.
    retried = {n for n, r in lines.items() if r.attempts > 1}
    assert retried <= held, (retried, held)
    assert all(r.attempts <= 2 for r in lines.values())
    # Serve replaced the replica: two replicas answer again.
    seen: set[str] = set()

    def two_replicas() -> bool:
        try:
            with prod_stack.http() as http:
                resp = http.post("/v1/embeddings", json={"model": EMBED, "input": "x"})
        except httpx.HTTPError:  # the proxy still routing to the dead replica
            return False
        if resp.status_code == 200:
            seen.add(replica(resp))
        return len(seen) >= 2

    wait_for("two gateway replicas answering again", two_replicas, 180.0, 0.2)


def test_a_batch_cancelled_while_lines_run_stops_and_bills_what_ran(
    prod_stack: ProductionStack,
) -> None:
    key = prod_stack.key("cancel-user")
    batch_id = submit(prod_stack, key, embedding_lines(LINES, "cancel"))
    with ClaimWatch(prod_stack, batch_id) as watch:
        wait_both_workers(watch)
        with prod_stack.http(key) as http:
            resp = http.post(f"/v1/batches/{batch_id}/cancel")
        assert resp.status_code == 200, resp.text
        assert resp.json()["status"] in ("cancelling", "cancelled"), resp.text
        batch = wait_terminal(prod_stack, key, batch_id)
    assert batch["status"] == "cancelled", batch
    # Counts are of the lines that ran (the worker's finish: a cancel fails none of them);
    # the never-run ones are in the error file.
    _stopped_partway(prod_stack, key, batch, "batch_cancelled", never_failed=False)


def test_redis_down_for_20_s_fails_closed_and_the_quota_is_rebuilt(
    prod_stack: ProductionStack,
) -> None:
    with prod_stack.http() as http:
        probe = http.post("/v1/embeddings", json={"model": EMBED, "input": "quota text"})
    per_request = probe.json()["usage"]["prompt_tokens"]
    quota = 8 * per_request
    key = prod_stack.key("redis-user", daily_tokens=quota)
    body = {"model": EMBED, "input": "quota text"}
    with prod_stack.http(key) as http:
        for _ in range(3):
            assert http.post("/v1/embeddings", json=body).status_code == 200
        user_id = prod_stack.accounts.get_user("redis-user").id  # type: ignore[union-attr]
        wait_for(
            "the 3 requests in the ledger",
            lambda: (
                prod_stack.scalar(
                    "SELECT count(*) FROM usage_records WHERE user_id = :u", u=user_id
                )
                == 3
            ),
            30.0,
        )
        # Load beside the live calls: a batch of another user (no limit applies to its
        # lines, so they need no counter; they still read the accounts generation).
        batch_key = prod_stack.key("redis-batch-user")
        batch_id = submit(prod_stack, batch_key, embedding_lines(LINES, "redis"))
        prod_stack.redis.stop()
        stopped = time.monotonic()
        seen: set[str] = set()
        try:
            # production: limits fail closed, on every replica, as 503 with Retry-After.
            while time.monotonic() - stopped < REDIS_DOWN_S:
                resp = http.post("/v1/embeddings", json=body)
                assert resp.status_code == 503, resp.text
                assert resp.headers.get("retry-after"), resp.headers
                seen.add(replica(resp))
                time.sleep(0.5)
        finally:
            prod_stack.redis.start()  # empty: the counters are gone
        assert len(seen) == 2, seen
        # The daily counter is rebuilt from the ledger: 3 spent, 5 left, then refused.
        admitted = 0
        for _ in range(20):
            resp = http.post("/v1/embeddings", json=body)
            if resp.status_code == 429:
                assert resp.json()["error"]["code"] == "insufficient_quota", resp.text
                break
            assert resp.status_code == 200, resp.text
            admitted += 1
    assert admitted == 5
    _ended_whole(prod_stack, batch_key, wait_terminal(prod_stack, batch_key, batch_id), "redis")
    # Nothing refused during the outage was billed.
    wait_for(
        "8 requests in the ledger",
        lambda: (
            prod_stack.scalar("SELECT count(*) FROM usage_records WHERE user_id = :u", u=user_id)
            == 8
        ),
        30.0,
    )


def test_the_heads_engine_killed_mid_batch_loses_and_doubles_nothing(
    prod_stack: ProductionStack,
) -> None:
    """The embeddings head's vLLM EngineCore SIGKILLed while both workers run lines: the
    lines in flight get 503 ``engine_dead`` and are deferred (not counted as attempts),
    Serve replaces the head, and the batch completes with every line once, billed once."""
    key = prod_stack.key("engine-user")
    batch_id = submit(prod_stack, key, embedding_lines(LINES, "engine"))
    with ClaimWatch(prod_stack, batch_id) as watch:
        wait_both_workers(watch)
        (head,) = [p for p in prod_stack.stragglers() if POOLING_TITLE in process_title(p)]
        cores = [
            child
            for child in psutil.Process(head).children(recursive=True)
            if "EngineCore" in " ".join(child.cmdline())
        ]
        assert cores, f"no EngineCore under the embeddings head {head}"
        done_at_kill = watch.done_lines
        for core in cores:
            core.send_signal(signal.SIGKILL)
        batch = wait_terminal(prod_stack, key, batch_id)
    assert done_at_kill < LINES, "the batch ended before the kill"
    _ended_whole(prod_stack, key, batch, "engine")
    # A line the dead engine refused was given back, not counted as an attempt.
    assert all(r.attempts == 1 for r in line_states(prod_stack, batch_id))


def test_a_batch_expiring_while_lines_run_keeps_what_ran_and_bills_it_once(
    prod_stack: ProductionStack,
) -> None:
    """The batch's window ends (its ``expires_at`` moved to now in the database, as the
    clock would) while both workers run lines: the running lines end with their result, no
    other line starts, and the batch is ``expired`` with the rest in the error file as
    ``batch_expired``, counted in ``failed``; counts, ledger and files agree."""
    key = prod_stack.key("expiry-user")
    batch_id = submit(prod_stack, key, embedding_lines(LINES, "expiry"))
    with ClaimWatch(prod_stack, batch_id) as watch:
        wait_both_workers(watch)
        with prod_stack.db.engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE batches SET expires_at = now() WHERE id = :b"), {"b": batch_id}
            )
        batch = wait_terminal(prod_stack, key, batch_id)
    assert batch["status"] == "expired", batch
    _stopped_partway(prod_stack, key, batch, "batch_expired", never_failed=True)


PG_DOWN_S = 10.0


def test_postgresql_restarted_under_load_loses_no_usage(prod_stack: ProductionStack) -> None:
    """The stack's PostgreSQL stopped (``-m fast``: sessions cut) for 10 s under live calls
    and a running batch, then started again: every call is answered 200, as
    docs/deployment.md promises (its key verified within the auth cache's 60 s on both
    replicas, its usage spooled); the ledger ends equal to the 200s the client got, and
    the batch ends whole. (Only a UTC day turning during the outage may refuse calls, with
    the contract's 503: the new day's quota is read from the ledger.)"""
    # Every account write comes before the key is cached: a write moves the accounts
    # generation and drops every replica's cache (a key made after the caching emptied it,
    # and every call in the outage was refused).
    batch_key = prod_stack.key("pg-batch-user")
    key = prod_stack.key("pg-user")
    user_id = prod_stack.accounts.get_user("pg-user").id  # type: ignore[union-attr]
    body = {"model": EMBED, "input": "outage text"}
    answered = 0
    refused: list[str] = []
    seen: set[str] = set()
    with prod_stack.http(key) as http:

        def both_replicas_know_the_key() -> bool:
            nonlocal answered
            resp = http.post("/v1/embeddings", json=body)
            assert resp.status_code == 200, resp.text
            answered += 1
            seen.add(replica(resp))
            return len(seen) == 2

        batch_id = submit(prod_stack, batch_key, embedding_lines(LINES, "pg"))
        wait_for("both replicas caching the key", both_replicas_know_the_key, 60.0, 0.1)
        day = datetime.now(UTC).date()
        prod_stack.postgres.stop()
        stopped = time.monotonic()
        try:
            while time.monotonic() - stopped < PG_DOWN_S:
                resp = http.post("/v1/embeddings", json=body)
                if resp.status_code == 200:
                    answered += 1
                else:
                    assert resp.status_code == 503, resp.text
                    assert resp.json()["error"]["code"], resp.text
                    refused.append(resp.text)
                time.sleep(0.2)
        finally:
            prod_stack.postgres.start()
        for _ in range(3):
            resp = http.post("/v1/embeddings", json=body)
            assert resp.status_code == 200, resp.text
            answered += 1
    print(f"PostgreSQL down {PG_DOWN_S:g} s: {answered} answered, {len(refused)} refused")
    print("refusals:", sorted(set(refused)))
    assert not refused or datetime.now(UTC).date() != day, refused[0]
    wait_for(
        f"the ledger to hold the {answered} answered calls",
        lambda: (
            prod_stack.scalar("SELECT count(*) FROM usage_records WHERE user_id = :u", u=user_id)
            == answered
        ),
        120.0,
        0.5,
    )
    _ended_whole(prod_stack, batch_key, wait_terminal(prod_stack, batch_key, batch_id), "pg")


FINALIZE_INPUTS = 64
"""Inputs a line in the finalization fault: ~60 MB of output, so writing the files and
streaming them to the object store takes long enough to kill the finalizer meanwhile."""


def test_a_gateway_replica_killed_while_finalizing_leaves_the_output_whole(
    prod_stack: ProductionStack,
) -> None:
    """The worker holding the batch's finalization lease (``batches.lease_owner`` once
    ``finalizing_at`` is set) is SIGKILLed mid-finalization: after its lease the other
    worker finalizes again from the stored results, so the output file is whole, each line
    once, and each line billed once."""
    key = prod_stack.key("finalize-user")
    batch_id = submit(prod_stack, key, embedding_lines(LINES, "final", FINALIZE_INPUTS))

    def finalizer() -> str | None:
        rows = prod_stack.rows(
            "SELECT lease_owner FROM batches WHERE id = :b AND finalizing_at IS NOT NULL "
            "AND lease_owner IS NOT NULL AND completed_at IS NULL",
            b=batch_id,
        )
        return str(rows[0].lease_owner) if rows else None

    victim = wait_for("a worker finalizing the batch", finalizer, 240.0, 0.01)
    pid = worker_pid(victim)
    assert GATEWAY_TITLE in process_title(pid), (pid, process_title(pid))
    os.kill(pid, signal.SIGKILL)
    assert prod_stack.scalar("SELECT completed_at FROM batches WHERE id = :b", b=batch_id) is None
    batch = wait_terminal(prod_stack, key, batch_id)
    _ended_whole(prod_stack, key, batch, "final")
    assert all(r.attempts == 1 for r in line_states(prod_stack, batch_id))
