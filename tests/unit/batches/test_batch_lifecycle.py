"""Batches end to end in-process: validation, runs, counts, files, cancel, expiry,
billing at the discount, and a worker killed mid-batch, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from serve_app.batches.records import line_request_id
from tests.fixtures.waiting import until
from tests.unit.batches.conftest import BatchHarness, chat_line, make_batch_harness


async def test_a_batch_runs_every_line_once_and_bills_each_at_the_discount(
    batches: BatchHarness,
) -> None:
    created = await batches.create([chat_line(f"req-{i}", f"line {i}") for i in range(3)])
    assert created["status"] == "validating"
    assert created["object"] == "batch" and created["metadata"] == {"purpose": "test"}
    assert created["request_counts"] == {"total": 0, "completed": 0, "failed": 0}

    await batches.worker.drain()
    done = await batches.get(created["id"])
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert done["error_file_id"] is None
    for stamp in ("in_progress_at", "finalizing_at", "completed_at"):
        assert done[stamp] is not None
    outputs = await batches.content(done["output_file_id"])
    assert [o["custom_id"] for o in outputs] == ["req-0", "req-1", "req-2"]
    for output in outputs:
        assert output["error"] is None
        assert output["response"]["status_code"] == 200
        assert output["id"] == line_request_id(created["id"], output["custom_id"])
        assert output["response"]["request_id"] == output["id"]
        assert output["response"]["body"]["object"] == "chat.completion"

    # The ledger, line by line against the output's usage: one record per line, under
    # the line's id, marked with the batch, at half the catalog's price.
    records = {r.request_id: r for r in batches.ledger()}
    assert set(records) == {o["id"] for o in outputs}
    for output in outputs:
        record, usage = records[output["id"]], output["response"]["body"]["usage"]
        assert record.batch_id == created["id"] and record.batch_discount == 0.5
        assert record.prompt_tokens == usage["prompt_tokens"]
        assert record.completion_tokens == usage["completion_tokens"]
        assert record.route == "chat"
        full = record.prompt_tokens * record.input_per_mtok / 1e6
        full += record.completion_tokens * record.output_per_mtok / 1e6
        assert record.cost == pytest.approx(full * 0.5) and record.cost > 0

    # Reading, listing and cancelling a finished batch bill nothing more.
    await batches.get(created["id"])
    async with batches.client() as http:
        assert (await http.get("/v1/batches")).status_code == 200
        assert (await http.post(f"/v1/batches/{created['id']}/cancel")).status_code == 409
    await batches.worker.drain()
    assert len(batches.ledger()) == 3


async def test_a_line_breaking_the_endpoints_rules_gets_the_routes_own_error(
    batches: BatchHarness,
) -> None:
    bad_body = chat_line("bad", temperature="hot")
    unknown_field_ok = chat_line("ok")
    streamed = chat_line("streamed", stream=True)
    created = await batches.create([unknown_field_ok, bad_body, streamed])
    await batches.worker.drain()
    done = await batches.get(created["id"])
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    errors = {e["custom_id"]: e for e in await batches.content(done["error_file_id"])}
    assert set(errors) == {"bad", "streamed"}
    async with batches.client() as http:
        direct = await http.post("/v1/chat/completions", json=bad_body["body"])
    assert errors["bad"]["response"]["status_code"] == direct.status_code == 400
    assert errors["bad"]["response"]["body"] == direct.json()
    assert errors["streamed"]["response"]["body"]["error"]["param"] == "stream"
    # A refused line produced nothing and is not billed.
    assert {r.request_id for r in batches.ledger()} == {line_request_id(created["id"], "ok")}


@pytest.mark.parametrize(
    ("line", "code", "param"),
    [
        ("not json at all", "invalid_json_line", None),
        ({**chat_line("x"), "url": "/v1/completions"}, "invalid_url", "url"),
        (chat_line("req-0"), "duplicate_custom_id", "custom_id"),
        ({**chat_line("x"), "method": "GET"}, "invalid_request", "method"),
        ({**chat_line("x"), "body": "text"}, "invalid_request", "body"),
        ({"method": "POST", "url": "/v1/chat/completions", "body": {}}, "invalid_request", None),
        (chat_line("x", model="no-such-model"), "model_not_found", "body.model"),
        (chat_line("x", model="external-chat"), "model_not_found", "body.model"),
        (chat_line("x", model="tts-model"), "model_not_found", "body.model"),
    ],
)
async def test_a_bad_file_fails_validation_naming_the_line(
    batches: BatchHarness, line: object, code: str, param: str | None
) -> None:
    created = await batches.create([chat_line("req-0"), line, chat_line("req-2")])
    await batches.worker.drain()
    failed = await batches.get(created["id"])
    assert failed["status"] == "failed" and failed["failed_at"] is not None
    assert failed["output_file_id"] is None and failed["error_file_id"] is None
    [error] = failed["errors"]["data"]
    assert error["code"] == code and error["line"] == 2
    if param is not None:
        assert error["param"] == param
    assert batches.ledger() == []


async def test_too_many_lines_and_an_empty_file_fail_validation(
    tmp_path: Path, database_url: str
) -> None:
    harness = await make_batch_harness(tmp_path, database_url, {"batches": {"max_lines": 2}})
    try:
        big = await harness.create([chat_line(f"r{i}") for i in range(3)])
        empty = await harness.create(["", "  "])
        await harness.worker.drain()
        assert (await harness.get(big["id"]))["errors"]["data"][0]["code"] == (
            "maximum_requests_exceeded"
        )
        assert (await harness.get(empty["id"]))["errors"]["data"][0]["code"] == "empty_file"
    finally:
        await harness.gw.aclose()
        harness.database.dispose()


async def test_cancel_stops_new_lines_and_keeps_finished_ones(
    tmp_path: Path, database_url: str
) -> None:
    harness = await make_batch_harness(tmp_path, database_url, {"batches": {"concurrency": 1}})
    try:
        created = await harness.create([chat_line(f"req-{i}") for i in range(3)])
        await harness.worker.step()  # validates, then starts the first line
        await harness.worker.drain_running()
        async with harness.client() as http:
            answer = await http.post(f"/v1/batches/{created['id']}/cancel")
        assert answer.status_code == 200 and answer.json()["status"] == "cancelling"
        assert answer.json()["cancelling_at"] is not None
        await harness.worker.drain()
        done = await harness.get(created["id"])
        assert done["status"] == "cancelled" and done["cancelled_at"] is not None
        assert done["request_counts"] == {"total": 3, "completed": 1, "failed": 0}
        [kept] = await harness.content(done["output_file_id"])
        assert kept["custom_id"] == "req-0"
        errors = await harness.content(done["error_file_id"])
        assert [e["custom_id"] for e in errors] == ["req-1", "req-2"]
        assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
        assert len(harness.ledger()) == 1
    finally:
        await harness.gw.aclose()
        harness.database.dispose()


async def test_a_validating_batch_cancels_without_running_anything(
    batches: BatchHarness,
) -> None:
    created = await batches.create([chat_line("a")])
    async with batches.client() as http:
        assert (await http.post(f"/v1/batches/{created['id']}/cancel")).status_code == 200
    await batches.worker.drain()
    done = await batches.get(created["id"])
    assert done["status"] == "cancelled" and done["output_file_id"] is None
    assert batches.ledger() == []


async def test_unfinished_lines_expire_after_the_window(batches: BatchHarness) -> None:
    batches.worker.options.concurrency = 1
    created = await batches.create([chat_line(f"req-{i}") for i in range(3)])
    await batches.worker.step()
    await batches.worker.drain_running()
    batches.clock.advance(24 * 3600 + 1)
    await batches.worker.drain()
    done = await batches.get(created["id"])
    assert done["status"] == "expired" and done["expired_at"] is not None
    assert done["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    errors = await batches.content(done["error_file_id"])
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert [e["custom_id"] for e in errors] == ["req-1", "req-2"]
    assert len(batches.ledger()) == 1


async def test_a_killed_workers_lines_resume_after_their_lease_once_each(
    batches: BatchHarness,
) -> None:
    created = await batches.create([chat_line(f"req-{i}") for i in range(4)])
    await batches.worker.step()  # validation (and the first lines, run below)
    await batches.worker.drain_running()
    # A worker claims two lines and dies before finishing them.
    store, lease_s = batches.worker.store, batches.worker.options.lease_s
    dead = store.claim_lines("dead-worker", 2, batches.clock(), lease_s)
    assert len(dead) == 2
    await batches.worker.drain()
    assert (await batches.get(created["id"]))["status"] == "in_progress"  # leases held
    batches.clock.advance(lease_s + 1)
    await batches.worker.drain()
    done = await batches.get(created["id"])
    assert done["status"] == "completed"
    outputs = await batches.content(done["output_file_id"])
    assert sorted(o["custom_id"] for o in outputs) == [f"req-{i}" for i in range(4)]
    assert len(batches.ledger()) == 4
    # The dead worker wakes up and tries to keep its result: refused, nothing billed.
    late = batches.worker_named("dead-worker")
    for line in dead:
        await late.run_line(line)
    assert len(batches.ledger()) == 4
    assert len(await batches.content(done["output_file_id"])) == 4


async def test_a_line_its_worker_gave_up_on_is_not_kept_by_its_heartbeat(
    batches: BatchHarness,
) -> None:
    """A worker whose line completion (or stage release) failed, the database being down,
    still has its name on the line; its heartbeat renews only what it is running, so the
    lease lapses and another worker runs the line (once the heartbeat renewed every lease
    under its name, and the batch stayed in progress for good)."""
    created = await batches.create([chat_line(f"gave-up-{i}") for i in range(2)])
    await batches.worker.run_stage()  # validation only
    store, lease_s = batches.worker.store, batches.worker.options.lease_s
    held = store.claim_lines("worker-a", 2, batches.clock(), lease_s)
    assert len(held) == 2
    alive = batches.worker_named("worker-a")  # running none of them: it gave up on both
    batches.clock.advance(lease_s - 1)
    await alive._heartbeat()
    renewed = store.heartbeat(
        "worker-a", batches.clock(), lease_s, [(held[0].batch_id, held[0].line)], None
    )
    assert renewed == 1  # a line it does run is renewed, by its id and the worker's name
    batches.clock.advance(2)  # past the first lease, not the renewed one
    await batches.worker.drain()
    assert (await batches.get(created["id"]))["request_counts"]["completed"] == 1
    batches.clock.advance(lease_s)
    await batches.worker.drain()
    done = await batches.get(created["id"])
    assert done["status"] == "completed", done
    assert len(batches.ledger()) == 2


async def test_two_workers_finishing_one_line_bill_it_once(batches: BatchHarness) -> None:
    created = await batches.create([chat_line("only")])
    await batches.worker.run_stage()  # validation only
    store, lease_s = batches.worker.store, batches.worker.options.lease_s
    [first] = store.claim_lines("worker-a", 1, batches.clock(), lease_s)
    batches.clock.advance(lease_s + 1)  # worker-a stalls past its lease
    [second] = store.claim_lines("worker-b", 1, batches.clock(), lease_s)
    assert second.attempts == 2
    await batches.worker_named("worker-b").run_line(second)
    await batches.worker_named("worker-a").run_line(first)
    await batches.worker.drain()
    done = await batches.get(created["id"])
    assert done["request_counts"]["completed"] == 1
    assert [r.request_id for r in batches.ledger()] == [line_request_id(created["id"], "only")]


async def test_the_worker_gives_way_to_live_requests(batches: BatchHarness) -> None:
    created = await batches.create([chat_line("a")])
    await batches.worker.run_stage()
    batches.worker.metering.live_in_flight = 1  # a live request is being served
    assert await batches.worker.step() is False
    assert (await batches.get(created["id"]))["request_counts"]["completed"] == 0
    batches.worker.metering.live_in_flight = 0  # it ended just now: the quiet period
    batches.worker.metering.live_ended_at = time.monotonic()
    assert await batches.worker.step() is False
    batches.worker.metering.live_ended_at -= batches.worker.options.live_quiet_s
    await batches.worker.drain()
    assert (await batches.get(created["id"]))["status"] == "completed"


async def test_live_traffic_is_counted_in_flight_while_it_runs(batches: BatchHarness) -> None:
    metering = batches.worker.metering
    seen: list[int] = []
    answered = asyncio.Event()

    async def watch() -> None:
        # Samples until the answer: the request's stall is one timer, each sample's wait a
        # shorter one scheduled before it, so a sample falls inside the stall on any machine.
        while not answered.is_set():
            seen.append(metering.live_in_flight)
            await asyncio.sleep(0.005)

    body = chat_line("x", "#stall 0.3")["body"]
    async with batches.client() as http:
        watcher = asyncio.create_task(watch())
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
        answered.set()
        await watcher
    assert max(seen) == 1 and metering.live_in_flight == 0


async def test_batch_lines_do_not_spend_live_rate_limits(tmp_path: Path, database_url: str) -> None:
    harness = await make_batch_harness(tmp_path, database_url, {"limits": {"rpm": 1}})
    try:
        created = await harness.create([chat_line(f"r{i}") for i in range(3)])
        await harness.worker.drain()
        assert (await harness.get(created["id"]))["request_counts"]["completed"] == 3
        async with harness.client() as http:
            first = await http.post("/v1/chat/completions", json=chat_line("x")["body"])
            second = await http.post("/v1/chat/completions", json=chat_line("x")["body"])
        assert first.status_code == 200 and second.status_code == 429
    finally:
        await harness.gw.aclose()
        harness.database.dispose()


async def test_the_daily_quota_still_holds_for_batch_lines(
    tmp_path: Path, database_url: str
) -> None:
    # The quota admits while the day's count is under it: the first line, not the second.
    harness = await make_batch_harness(
        tmp_path, database_url, {"limits": {"daily_tokens": 1}, "batches": {"concurrency": 1}}
    )
    try:
        created = await harness.create([chat_line("r0"), chat_line("r1")])
        await harness.worker.drain()
        done = await harness.get(created["id"])
        assert done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
        [error] = await harness.content(done["error_file_id"])
        assert error["custom_id"] == "r1"
        assert error["response"]["status_code"] == 429
        assert error["response"]["body"]["error"]["code"] == "insufficient_quota"
    finally:
        await harness.gw.aclose()
        harness.database.dispose()


async def test_enqueued_batch_tokens_are_limited_per_organization(
    tmp_path: Path, database_url: str
) -> None:
    harness = await make_batch_harness(
        tmp_path, database_url, {"batches": {"max_enqueued_tokens_per_org": 40}}
    )
    try:
        harness.worker.metering.live_in_flight = 1  # hold lines: the first batch stays queued
        first = await harness.create([chat_line("a")])  # ~30 tokens estimated
        second = await harness.create([chat_line("b")])
        await harness.worker.drain()
        assert (await harness.get(first["id"]))["status"] == "in_progress"
        refused = await harness.get(second["id"])
        assert refused["status"] == "failed"
        assert refused["errors"]["data"][0]["code"] == "token_limit_exceeded"
        harness.worker.metering.live_in_flight = 0
        await harness.worker.drain()
        assert (await harness.get(first["id"]))["status"] == "completed"
    finally:
        await harness.gw.aclose()
        harness.database.dispose()


async def test_completions_and_responses_batches(batches: BatchHarness) -> None:
    completion = {
        "custom_id": "c",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "scripted-chat", "prompt": "say hi", "max_tokens": 3},
    }
    response = {
        "custom_id": "r",
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": "scripted-chat", "input": "say hi", "max_output_tokens": 3},
    }
    one = await batches.create([completion], endpoint="/v1/completions")
    two = await batches.create([response], endpoint="/v1/responses")
    await batches.worker.drain()
    [c] = await batches.content((await batches.get(one["id"]))["output_file_id"])
    [r] = await batches.content((await batches.get(two["id"]))["output_file_id"])
    assert c["response"]["body"]["object"] == "text_completion"
    assert r["response"]["body"]["object"] == "response"
    routes = {rec.request_id: rec.route for rec in batches.ledger()}
    assert routes == {c["id"]: "completions", r["id"]: "responses"}


async def test_another_organizations_batch_is_not_found(batches: BatchHarness) -> None:
    created = await batches.create([chat_line("a")])
    async with batches.client("external") as http:
        for answer in (
            await http.get(f"/v1/batches/{created['id']}"),
            await http.post(f"/v1/batches/{created['id']}/cancel"),
        ):
            assert answer.status_code == 404
            assert answer.json()["error"]["code"] == "batch_not_found"
        listed = await http.get("/v1/batches")
        assert listed.json()["data"] == []
        refused = await http.post(
            "/v1/batches",
            json={
                "input_file_id": created["input_file_id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "file_not_found"


async def test_batch_create_is_validated(batches: BatchHarness) -> None:
    file_id = await batches.upload([chat_line("a")])
    good = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    cases = [
        ({**good, "endpoint": "/v1/audio/speech"}, "endpoint"),
        ({**good, "completion_window": "1h"}, "completion_window"),
        ({**good, "surprise": 1}, "surprise"),
        ({k: v for k, v in good.items() if k != "input_file_id"}, "input_file_id"),
        ({**good, "metadata": {"k" * 65: "v"}}, "metadata"),
    ]
    async with batches.client() as http:
        for body, param in cases:
            answer = await http.post("/v1/batches", json=body)
            assert answer.status_code == 400, body
            assert answer.json()["error"]["param"] == param


async def test_batches_list_pages_newest_first(batches: BatchHarness) -> None:
    ids = []
    for i in range(3):
        ids.append((await batches.create([chat_line(f"r{i}")]))["id"])
        batches.clock.advance(1)
    async with batches.client() as http:
        page = (await http.get("/v1/batches", params={"limit": 2})).json()
        assert [b["id"] for b in page["data"]] == ids[::-1][:2] and page["has_more"]
        rest = (await http.get("/v1/batches", params={"after": page["last_id"]})).json()
    assert [b["id"] for b in rest["data"]] == [ids[0]] and not rest["has_more"]


async def test_a_revoked_owner_key_fails_the_remaining_lines_at_once(
    batches: BatchHarness,
) -> None:
    """The worker cached the owner at validation (for 10 s); the revocation moves the
    accounts generation, which drops that cache before the next line."""
    created = await batches.create([chat_line("a")])
    await batches.worker.run_stage()
    assert batches.worker._owners  # the owner, cached by validation
    batches.gw.store.revoke_key(batches.gw.keys["user"])
    await batches.worker.drain()
    async with batches.gw.client(batches.gw.store.create_key("alice", "acme")) as http:
        done = (await http.get(f"/v1/batches/{created['id']}")).json()
        [error] = [
            json.loads(line)
            for line in (await http.get(f"/v1/files/{done['error_file_id']}/content")).text.split(
                "\n"
            )
            if line
        ]
    assert error["response"]["status_code"] == 401
    assert batches.ledger() == []


async def test_a_stopped_worker_puts_its_running_line_back(batches: BatchHarness) -> None:
    created = await batches.create([chat_line("slow", "#stall 30")])
    worker = batches.worker
    worker.start()
    await until(lambda: bool(worker._tasks))  # the loop validates the batch and starts the line
    await worker.stop()
    [line] = worker.store.claim_lines("next", 1, batches.clock(), 60)
    assert (line.custom_id, line.attempts) == ("slow", 1)  # back at once, try not counted
    assert (await batches.get(created["id"]))["request_counts"]["completed"] == 0
    assert batches.ledger() == []


async def test_an_input_file_deleted_before_validation_fails_the_batch(
    batches: BatchHarness,
) -> None:
    created = await batches.create([chat_line("a")])
    async with batches.client() as http:
        assert (await http.delete(f"/v1/files/{created['input_file_id']}")).status_code == 200
    await batches.worker.drain()
    failed = await batches.get(created["id"])
    assert failed["status"] == "failed"
    assert failed["errors"]["data"][0]["code"] == "file_not_found"
