"""Batches cannot exhaust a replica's memory: a batch whose output is ~210 MB (100
embeddings lines of ~2.1 MB each, from the scripted pooling engine) is finalized by a
fresh process whose resident memory stays under 256 MiB above its idle size, and the
output file holds every line; a line whose answer passes the line cap fails with
``result_too_large`` and is not billed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from deployments.embeddings.head import PoolingHeadCore
from serve_app.heads.client import LocalPoolingClient, PoolingClient
from serve_app.storage.objects import LocalObjectStore
from tests.fakes.scripted_pooling import ScriptedPoolingEngine
from tests.fixtures.gateway import CATALOG
from tests.unit.batches.conftest import BatchHarness, make_batch_harness

WIDE = "scripted-wide-embed"
DIMENSIONS = 4096
INPUTS = 128  # one word each: one-hot vectors, ~4 bytes a float ("0.0,"): ~2.1 MB a line
LINES = 100
MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]


def _wide_entry() -> dict[str, Any]:
    return {
        "id": WIDE,
        "head": "pooling",
        "output_modalities": ["embedding"],
        "context_length": 32,
        "pooling": {"dimensions": DIMENSIONS},
        "pricing": {"mode": "fixed", "input_per_mtok": 2.0},
        "engine": {"backend": "scripted", "config": {"dimensions": DIMENSIONS}},
    }


def _line(custom_id: str, inputs: int) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": WIDE, "input": [f"w{i}" for i in range(inputs)]},
    }


async def _harness(tmp_path: Path, batches: dict[str, Any]) -> BatchHarness:
    core = PoolingHeadCore(ScriptedPoolingEngine({"dimensions": DIMENSIONS}))
    await core.start()
    heads: dict[str, PoolingClient] = {WIDE: LocalPoolingClient(core)}
    database_url = f"sqlite:///{tmp_path / 'batches.db'}"
    args = {"catalog": [*CATALOG, _wide_entry()], "batches": batches}
    return await make_batch_harness(tmp_path, database_url, args, heads)


async def _run_lines(harness: BatchHarness) -> None:
    """Validate and run every line, stopping short of finalization."""
    worker = harness.worker
    assert await worker.run_stage()
    while await worker._fill():
        await worker.drain_running()


async def test_finalizing_200_mb_of_output_stays_under_256_mib(tmp_path: Path) -> None:
    unlimited = {"max_enqueued_tokens_per_org": None}  # ~52M tokens: 128 x 4096 a line
    harness = await _harness(tmp_path, {"yield_to_live": False, "concurrency": 4, **unlimited})
    try:
        created = await harness.create(
            [_line(f"l{i}", INPUTS) for i in range(LINES)], endpoint="/v1/embeddings"
        )
        await _run_lines(harness)
        assert (await harness.get(created["id"]))["status"] == "in_progress"
        objects = harness.worker.objects
        assert isinstance(objects, LocalObjectStore)
        probe = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.unit.batches.finalize_probe",
                str(harness.database.engine.url),
                str(objects.root),
                harness.clock().isoformat(),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=300,
        )
        assert probe.returncode == 0, probe.stderr[-3000:]
        memory = json.loads(probe.stdout.strip().splitlines()[-1])
        assert memory["staged"]
        done = await harness.get(created["id"])
        assert done["status"] == "completed"
        assert done["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
        lines, size = 0, 0
        async with (
            harness.client() as http,
            http.stream("GET", f"/v1/files/{done['output_file_id']}/content") as answer,
        ):
            assert answer.status_code == 200
            async for chunk in answer.aiter_bytes():
                lines += chunk.count(b"\n")
                size += len(chunk)
        assert lines == LINES and size > 200_000_000
        above_idle = memory["peak"] - memory["idle"]
        assert above_idle < 256 * MIB, f"{above_idle / MIB:.0f} MiB above idle"
    finally:
        await harness.gw.aclose()
        harness.database.dispose()


async def test_a_line_over_the_result_cap_fails_unbilled(tmp_path: Path) -> None:
    harness = await _harness(tmp_path, {"max_line_result_bytes": 64 * 1024})
    try:
        created = await harness.create(
            [_line("small", 1), _line("huge", 64), _line("also-small", 2)],
            endpoint="/v1/embeddings",
        )
        await harness.worker.drain()
        done = await harness.get(created["id"])
        assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
        outputs = await harness.content(done["output_file_id"])
        assert [o["custom_id"] for o in outputs] == ["small", "also-small"]
        assert len(outputs[0]["response"]["body"]["data"][0]["embedding"]) == DIMENSIONS
        [error] = await harness.content(done["error_file_id"])
        assert error["custom_id"] == "huge" and error["response"] is None
        assert error["error"]["code"] == "result_too_large"
        assert "65536" in error["error"]["message"]
        billed = {r.request_id for r in harness.ledger()}
        assert billed == {o["id"] for o in outputs}
    finally:
        await harness.gw.aclose()
        harness.database.dispose()
