"""What only the production topology has, on it: limits held in Redis and revocations
seen across two gateway replicas, and one batch claimed by both replicas' workers.

Every answer names its replica (``x-service-replica``); each test shows that both
replicas took part, so a per-replica counter or cache would fail it.
"""

from __future__ import annotations

import time

import httpx
import pytest

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
from tests.production.stack import EMBED, ProductionStack, replica, wait_for

pytestmark = pytest.mark.production

RPM = 10
SPREAD_TRIES = 40
"""Requests sent until both replicas have answered one way (Serve picks a replica at random
for each: two in a row from the same one is a coin flip, forty is never)."""


def embed(http: httpx.Client, text: str = "the same short text") -> httpx.Response:
    return http.post("/v1/embeddings", json={"model": EMBED, "input": text})


def refused_on_both(http: httpx.Client, status: int, code: str) -> set[str]:
    """Send until both replicas have refused; every answer must be that refusal."""
    seen: set[str] = set()
    for _ in range(SPREAD_TRIES):
        resp = embed(http)
        assert resp.status_code == status, resp.text
        assert resp.json()["error"]["code"] == code, resp.text
        seen.add(replica(resp))
        if len(seen) == 2:
            break
    assert len(seen) == 2, f"{SPREAD_TRIES} refusals all from {seen}"
    return seen


def test_the_rate_limit_is_one_counter_across_both_replicas(prod_stack: ProductionStack) -> None:
    key = prod_stack.key("rpm-user", rpm=RPM)
    served: list[str] = []
    remaining: list[int] = []
    with prod_stack.http(key) as http:
        for _ in range(RPM):
            resp = embed(http)
            assert resp.status_code == 200, resp.text
            served.append(replica(resp))
            remaining.append(int(resp.headers["x-ratelimit-remaining-requests"]))
        # One counter: the remaining count falls by one per request whichever replica
        # admitted it (per-replica counters would each start again at RPM - 1).
        assert remaining == list(range(RPM - 1, -1, -1)), (remaining, served)
        assert len(set(served)) == 2, f"all {RPM} requests went to {served[0]}"
        refused_on_both(http, 429, "rate_limit_exceeded")


def test_the_daily_quota_is_exact_across_both_replicas(prod_stack: ProductionStack) -> None:
    with prod_stack.http() as http:
        probe = embed(http)
    assert probe.status_code == 200, probe.text
    per_request = probe.json()["usage"]["prompt_tokens"]
    admitted = 12
    key = prod_stack.key("daily-user", daily_tokens=admitted * per_request)
    served: list[str] = []
    with prod_stack.http(key) as http:
        for _ in range(admitted):
            resp = embed(http)
            assert resp.status_code == 200, (len(served), resp.text)
            assert resp.json()["usage"]["prompt_tokens"] == per_request
            served.append(replica(resp))
        assert len(set(served)) == 2, f"all requests went to {served[0]}"
        refused_on_both(http, 429, "insufficient_quota")
    user_id = prod_stack.accounts.get_user("daily-user").id  # type: ignore[union-attr]

    def ledger() -> tuple[int, int] | None:
        row = prod_stack.rows(
            "SELECT count(*) AS n, coalesce(sum(prompt_tokens), 0) AS tokens FROM usage_records "
            "WHERE user_id = :u",
            u=user_id,
        )[0]
        return (row.n, row.tokens) if row.n >= admitted else None

    # The spool commits every second; the refusals are not billed.
    assert wait_for("the ledger", ledger, 30.0) == (admitted, admitted * per_request)
    time.sleep(1.5)  # one more flush: nothing else arrives
    assert ledger() == (admitted, admitted * per_request)


def test_a_key_revoked_through_one_replica_is_refused_by_the_other(
    prod_stack: ProductionStack,
) -> None:
    from serve_app.auth.sessions import SessionStore

    key = prod_stack.key("revoker")
    password = "correct horse battery staple"
    SessionStore(prod_stack.db, prod_stack.accounts, ttl_s=3600).set_password("revoker", password)
    (info,) = prod_stack.accounts.list_keys("revoker")
    # Both replicas have verified (and cached, GATEWAY_AUTH_CACHE_SECONDS=60) the key.
    warm: set[str] = set()
    with prod_stack.http(key) as http:
        for _ in range(SPREAD_TRIES):
            resp = embed(http)
            assert resp.status_code == 200, resp.text
            warm.add(replica(resp))
            if len(warm) == 2:
                break
    assert len(warm) == 2
    with httpx.Client(base_url=prod_stack.base_url, timeout=60) as browser:
        signed = browser.post("/api/session", json={"username": "revoker", "password": password})
        assert signed.status_code == 200, signed.text
        # The session cookie, sent as a browser would (the stdlib cookie jar is unsure
        # about bare IP hosts), with the CSRF token a write needs.
        cookies = [c.split(";", 1)[0] for c in signed.headers.get_list("set-cookie")]
        assert cookies, signed.headers
        browser.headers["Cookie"] = "; ".join(cookies)
        browser.cookies.clear()
        browser.headers["X-CSRF-Token"] = signed.json()["csrf_token"]
        revoked = browser.delete(f"/api/keys/{info.key_id}")
    assert revoked.status_code == 200, revoked.text
    revoking = replica(revoked)
    with prod_stack.http(key) as http:
        refused = refused_on_both(http, 401, "invalid_api_key")
    assert refused - {revoking}, "the other replica was never asked"


def test_a_batch_is_claimed_by_both_workers_and_each_line_runs_and_bills_once(
    prod_stack: ProductionStack,
) -> None:
    key = prod_stack.key("batch-user")
    batch_id = submit(prod_stack, key, embedding_lines(LINES, "e2e"))
    with ClaimWatch(prod_stack, batch_id) as watch:
        wait_both_workers(watch)
        batch = wait_terminal(prod_stack, key, batch_id)
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
    assert len(watch.owners) >= 2, watch.owners
    lines = line_states(prod_stack, batch_id)
    assert [r.attempts for r in lines] == [1] * LINES  # each line claimed (run) once
    assert all(r.status == "succeeded" and r.has_result for r in lines)
    ledger = settle_ledger(prod_stack, batch_id, LINES)  # billed once each
    outputs = output_lines(prod_stack, key, batch["output_file_id"])
    assert sorted(o["custom_id"] for o in outputs) == sorted(f"e2e-{i}" for i in range(LINES))
    by_request = {o["id"]: o for o in outputs}
    assert len(by_request) == LINES
    for row in ledger:
        body = by_request[row.request_id]["response"]["body"]
        assert body["usage"]["prompt_tokens"] == row.prompt_tokens
