"""End to end: the openai SDK, unchanged, runs a batch on the Ray Serve stack's real
vLLM head: upload, create, poll until done, read the output and error files, and
the ledger compared line by line with the output's usage."""

from __future__ import annotations

import io
import json
import os
import time

import pytest

from serve_app.billing.store import LedgerStore
from serve_app.storage.db import Database
from tests.serve.conftest import SMOLLM, ServeStack

pytestmark = pytest.mark.serve


def _line(custom_id: str, **body: object) -> dict[str, object]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": SMOLLM,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 4,
            **body,
        },
    }


def test_the_openai_sdk_runs_a_batch_on_the_real_head(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    lines = [_line("first"), _line("second", temperature=0), _line("bad", temperature="hot")]
    jsonl = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("batch.jsonl", io.BytesIO(jsonl)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"suite": "e2e"},
    )
    deadline = time.monotonic() + 180
    while batch.status in ("validating", "in_progress", "finalizing"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (3, 2)
    assert batch.request_counts.failed == 1
    assert batch.output_file_id is not None and batch.error_file_id is not None

    outputs = [
        json.loads(x) for x in client.files.content(batch.output_file_id).text.split("\n") if x
    ]
    errors = [
        json.loads(x) for x in client.files.content(batch.error_file_id).text.split("\n") if x
    ]
    assert sorted(o["custom_id"] for o in outputs) == ["first", "second"]
    assert [e["custom_id"] for e in errors] == ["bad"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["param"] == "temperature"

    # The ledger: one record per run line, under its output id, at the batch discount.
    ledger = LedgerStore(Database(os.environ["GATEWAY_DATABASE_URL"]))
    for output in outputs:
        usage = output["response"]["body"]["usage"]
        assert 0 < usage["completion_tokens"] <= 4
        record = ledger.get(output["id"])
        assert record is not None and record.batch_id == batch.id
        assert (record.prompt_tokens, record.completion_tokens) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        full = (usage["prompt_tokens"] * 0.1 + usage["completion_tokens"] * 0.2) / 1e6
        assert record.cost == pytest.approx(full * 0.5)
    assert ledger.get(errors[0]["id"]) is None
