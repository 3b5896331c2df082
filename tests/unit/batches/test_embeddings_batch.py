"""A batch of ``/v1/embeddings`` lines runs on the pooling head, billed per input token."""

from __future__ import annotations

import base64
from pathlib import Path

from deployments.embeddings.head import PoolingHeadCore
from serve_app.heads.client import LocalPoolingClient, PoolingClient
from tests.fakes.scripted_pooling import ScriptedPoolingEngine
from tests.fixtures.gateway import CATALOG
from tests.unit.batches.conftest import make_batch_harness
from tests.unit.embeddings.conftest import EMBED, POOLING_CATALOG


async def test_an_embeddings_batch_answers_each_line_like_the_route(
    tmp_path: Path, database_url: str
) -> None:
    core = PoolingHeadCore(ScriptedPoolingEngine({}))
    await core.start()
    heads: dict[str, PoolingClient] = {EMBED: LocalPoolingClient(core)}
    batches = await make_batch_harness(
        tmp_path, database_url, {"catalog": [*CATALOG, *POOLING_CATALOG]}, heads
    )
    try:
        line = {"method": "POST", "url": "/v1/embeddings"}
        lines = [
            {**line, "custom_id": "a", "body": {"model": EMBED, "input": ["a cat", "a dog"]}},
            {
                **line,
                "custom_id": "b",
                "body": {"model": EMBED, "input": "a cat", "encoding_format": "base64"},
            },
            {**line, "custom_id": "c", "body": {"model": EMBED, "input": ""}},  # the route's 400
        ]
        created = await batches.create(lines, endpoint="/v1/embeddings")
        await batches.worker.drain()
        done = await batches.get(created["id"])
        assert done["status"] == "completed"
        assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
        outputs = {o["custom_id"]: o for o in await batches.content(done["output_file_id"])}
        first = outputs["a"]["response"]["body"]
        assert [d["index"] for d in first["data"]] == [0, 1]
        floats = first["data"][0]["embedding"]
        packed = outputs["b"]["response"]["body"]["data"][0]["embedding"]
        assert len(base64.b64decode(packed)) == 4 * len(floats)
        errors = await batches.content(done["error_file_id"])
        assert errors[0]["custom_id"] == "c"
        assert errors[0]["response"]["status_code"] == 400
        billed = {r.request_id: r for r in batches.ledger()}
        assert {outputs["a"]["id"], outputs["b"]["id"]} == set(billed)
        assert billed[outputs["a"]["id"]].prompt_tokens == first["usage"]["prompt_tokens"]
    finally:
        await batches.gw.aclose()
        batches.database.dispose()
