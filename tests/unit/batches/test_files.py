"""``/v1/files``: upload, list, read, download, delete, bounds, ownership; and the openai
SDK's file and batch calls against the in-process gateway."""

from __future__ import annotations

import io
import json
from pathlib import Path

from tests.unit.batches.conftest import BatchHarness, chat_line, make_batch_harness


async def test_upload_list_read_download_delete(batches: BatchHarness) -> None:
    content = b'{"a": 1}\n'
    async with batches.client() as http:
        answer = await http.post(
            "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
        )
        assert answer.status_code == 200
        made = answer.json()
        assert made["object"] == "file" and made["purpose"] == "batch"
        assert made["bytes"] == len(content) and made["filename"] == "in.jsonl"
        assert made["status"] == "processed"
        assert (await http.get(f"/v1/files/{made['id']}")).json() == made
        assert (await http.get(f"/v1/files/{made['id']}/content")).content == content
        listed = (await http.get("/v1/files")).json()
        assert listed["object"] == "list" and [f["id"] for f in listed["data"]] == [made["id"]]
        gone = await http.delete(f"/v1/files/{made['id']}")
        assert gone.json() == {"id": made["id"], "object": "file", "deleted": True}
        for path in (f"/v1/files/{made['id']}", f"/v1/files/{made['id']}/content"):
            missing = await http.get(path)
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "file_not_found"
        assert (await http.delete(f"/v1/files/{made['id']}")).status_code == 404


async def test_another_organizations_file_is_not_found(batches: BatchHarness) -> None:
    file_id = await batches.upload([chat_line("a")])
    async with batches.client("external") as http:
        for answer in (
            await http.get(f"/v1/files/{file_id}"),
            await http.get(f"/v1/files/{file_id}/content"),
            await http.delete(f"/v1/files/{file_id}"),
        ):
            assert answer.status_code == 404
        assert (await http.get("/v1/files")).json()["data"] == []
    async with batches.client() as http:
        assert (await http.get(f"/v1/files/{file_id}")).status_code == 200


async def test_uploads_are_bounded_and_checked(tmp_path: Path, database_url: str) -> None:
    harness = await make_batch_harness(tmp_path, database_url, {"batches": {"max_file_bytes": 64}})
    try:
        async with harness.client() as http:
            big = await http.post(
                "/v1/files", files={"file": ("a.jsonl", b"x" * 65)}, data={"purpose": "batch"}
            )
            assert big.status_code == 413
            wrong = await http.post(
                "/v1/files", files={"file": ("a.jsonl", b"{}")}, data={"purpose": "fine-tune"}
            )
            assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "purpose"
            nofile = await http.post("/v1/files", data={"purpose": "batch"})
            assert nofile.status_code == 400 and nofile.json()["error"]["param"] == "file"
            anonymous = await harness.gw.client().post("/v1/files", data={"purpose": "batch"})
            assert anonymous.status_code == 401
    finally:
        await harness.gw.aclose()
        harness.database.dispose()


async def test_the_openai_sdk_runs_a_batch(batches: BatchHarness) -> None:
    client = batches.gw.openai(batches.gw.keys["user"])
    lines = [chat_line("first", "one two"), chat_line("second", "three")]
    jsonl = "".join(f"{json.dumps(line)}\n" for line in lines).encode()
    uploaded = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl)
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "validating"
    await batches.worker.drain()
    batch = await client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts is not None
    assert batch.request_counts.completed == 2 and batch.output_file_id is not None
    output = (await client.files.content(batch.output_file_id)).text
    assert [line for line in output.splitlines() if '"custom_id": "first"' in line]
    output_file = await client.files.retrieve(batch.output_file_id)
    assert output_file.purpose == "batch_output"
    listed = [b.id async for b in client.batches.list()]
    assert listed == [batch.id]
    files = [f.id async for f in client.files.list()]
    assert set(files) == {uploaded.id, batch.output_file_id}
