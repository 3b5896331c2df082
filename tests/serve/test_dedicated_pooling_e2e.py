"""A dedicated endpoint of an embedding model end to end: a real ``ded-<slug>`` Serve app
running the pooling head, next to the ``gateway`` app.

The model is the scripted pooling engine (tests/fakes/scripted_pooling.py) at a tenth of
a CPU per replica; the test drives the public API (raw HTTP and the openai client's
``embeddings.create``) and checks Serve's own state from the driver, as
tests/serve/test_dedicated_e2e.py does for chat.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from tests.serve.conftest import ServeStack
from tests.serve.dedicated_config import DEDICATED_POOLING_MODEL
from tests.serve.test_dedicated_e2e import (
    endpoint,
    replica_ids,
    serve_apps,
    until_status,
    wait_for,
)

pytestmark = pytest.mark.serve

ALIAS = "ded/e2e-embed"
APP = "ded-e2e-embed"


@pytest.fixture(scope="module")
def embed_admin(serve_stack: ServeStack) -> Iterator[httpx.Client]:
    key = serve_stack.store.create_key("ded-embed-admin", "ded-embed-e2e-org", role="admin")
    with serve_stack.http(key) as client:
        client.headers["x-test-key"] = key
        yield client


def test_embedding_endpoint_life_on_real_serve(
    serve_stack: ServeStack, embed_admin: httpx.Client
) -> None:
    key = embed_admin.headers["x-test-key"]
    body = {"model_id": DEDICATED_POOLING_MODEL, "alias_slug": "e2e-embed", "mode": "spot"}
    created = embed_admin.post(
        "/api/dedicated", json={**body, "min_replicas": 1, "max_replicas": 2}
    )
    assert created.status_code == 201, created.text
    bounds = created.json()["engine_bounds"]
    assert bounds["prefix_caching"]["reason"] == "pooling_model"
    eid: str = created.json()["endpoint_id"]
    state = until_status(embed_admin, eid, "active")
    assert state["live"] == {"replicas_ready": 1, "replicas_total": 1}
    _serves_embeddings_and_scores(serve_stack, embed_admin, key)
    _patch_is_live(embed_admin, eid)
    billed = endpoint(embed_admin, eid)
    assert billed["month_minutes"]["spot"] > 0 and billed["month_cost"] > 0
    telemetry = embed_admin.get(f"/api/dedicated/{eid}/telemetry?window=1h").json()
    assert telemetry["requests"]["ok"] >= 3 and telemetry["tokens"]["prompt"] > 0
    health = embed_admin.get(f"/api/dedicated/{eid}/health").json()
    assert health["sampled"] is True and health["replicas_sampled"] == 1, health
    assert health["replicas"][0]["tokens"] > 0  # input tokens the replica encoded
    assert embed_admin.delete(f"/api/dedicated/{eid}").json()["status"] == "deleted"
    with pytest.raises(openai.NotFoundError) as gone:
        serve_stack.openai(key).embeddings.create(model=ALIAS, input="gone")
    assert gone.value.code == "model_not_found"
    wait_for("app deleted", lambda: APP not in serve_apps())
    assert "gateway" in serve_apps()


def _serves_embeddings_and_scores(stack: ServeStack, http: httpx.Client, key: str) -> None:
    client = stack.openai(key)
    floats = client.embeddings.create(model=ALIAS, input=["a cat on a mat", "stock markets"])
    assert floats.model == ALIAS and [d.index for d in floats.data] == [0, 1]
    assert len(floats.data[0].embedding) == 64 and floats.usage.prompt_tokens > 0
    packed = client.embeddings.create(model=ALIAS, input="a cat on a mat", encoding_format="base64")
    raw = packed.data[0].embedding
    vector = np.frombuffer(base64.b64decode(raw), dtype="<f4") if isinstance(raw, str) else raw
    assert np.allclose(vector, floats.data[0].embedding, atol=1e-6)
    ranked = http.post(
        "/v1/rerank", json={"model": ALIAS, "query": "cat", "documents": ["bonds", "a cat"]}
    )
    assert ranked.status_code == 200 and ranked.json()["results"][0]["index"] == 1
    chat = http.post(
        "/v1/chat/completions",
        json={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert chat.json()["error"]["code"] == "model_not_supported_for_endpoint"


def _patch_is_live(http: httpx.Client, eid: str) -> None:
    first = replica_ids(APP)
    policy = {"target_inputs": 2, "scale_down_idle_seconds": 30}
    patched = http.patch(f"/api/dedicated/{eid}", json={"max_replicas": 3, "scaling": policy})
    assert patched.status_code == 200 and patched.json()["scaling"]["profile"] == "custom"
    wait_for("patch applied", lambda: serve_apps()[APP].running)
    assert replica_ids(APP) == first  # lightweight update: same replica
