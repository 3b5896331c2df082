"""A dedicated endpoint's replica reached over HTTP directly (direct ingress gives it a port)."""

from __future__ import annotations

import asyncio
import json

from deployments.dedicated_head import DedicatedHead


def test_direct_http_to_the_replica_is_a_404_envelope_not_a_model_call() -> None:
    # Called on a bare object: the answer must need no engine, no state at all.
    response = asyncio.run(DedicatedHead.func_or_class.__call__(object(), None))
    assert response.status_code == 404
    error = json.loads(response.body)["error"]
    assert error["type"] == "invalid_request_error"
    assert "ded/<slug>" in error["message"]


def test_a_pooling_endpoints_replica_answers_direct_http_the_same_way() -> None:
    # A dedicated endpoint of an embedding model runs the catalog's pooling head.
    from deployments.embeddings.head import PoolingHead

    response = asyncio.run(PoolingHead.func_or_class.__call__(object(), None))
    assert response.status_code == 404
    assert "ded/<slug>" in json.loads(response.body)["error"]["message"]
