"""Embeddings, rerank and score on the real vLLM pooling engine (all-MiniLM-L6-v2 from its
PyPI wheel) in the shared Serve stack, through the openai SDK and raw HTTP."""

from __future__ import annotations

import numpy as np
import pytest

from tests.serve.conftest import MINILM, ServeStack

pytestmark = [pytest.mark.serve, pytest.mark.heads(MINILM)]

CAT = "The cat sits on the mat."
FELINE = "A feline rests on a rug."
STOCKS = "Stock markets fell sharply today."


def test_openai_sdk_vectors_float_and_base64(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    floats = client.embeddings.create(
        model=MINILM, input=[CAT, FELINE, STOCKS], encoding_format="float"
    )
    packed = client.embeddings.create(model=MINILM, input=[CAT, FELINE, STOCKS])  # SDK: base64
    vectors = np.array([d.embedding for d in floats.data])
    assert vectors.shape == (3, 384)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0, 1.0, 1.0], abs=1e-3)
    assert np.array([d.embedding for d in packed.data]) == pytest.approx(vectors, abs=1e-6)
    paraphrase, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert paraphrase > unrelated + 0.3, (paraphrase, unrelated)
    assert floats.usage.prompt_tokens == packed.usage.prompt_tokens > 3 * 2


def test_rerank_and_score_are_the_cosine(serve_stack: ServeStack) -> None:
    with serve_stack.http() as http:
        ranked = http.post(
            "/v1/rerank", json={"model": MINILM, "query": CAT, "documents": [STOCKS, FELINE]}
        )
        scored = http.post(
            "/v1/score", json={"model": MINILM, "text_1": CAT, "text_2": [STOCKS, FELINE]}
        )
        vectors = http.post(
            "/v1/embeddings", json={"model": MINILM, "input": [CAT, STOCKS, FELINE]}
        )
    assert ranked.status_code == scored.status_code == vectors.status_code == 200, ranked.text
    assert [r["index"] for r in ranked.json()["results"]] == [1, 0]
    v = np.array([d["embedding"] for d in vectors.json()["data"]])
    cosines = [float(v[0] @ v[1]), float(v[0] @ v[2])]
    assert [d["score"] for d in scored.json()["data"]] == pytest.approx(cosines, abs=1e-3)


def test_refusals_from_the_engine(serve_stack: ServeStack) -> None:
    with serve_stack.http() as http:
        too_long = http.post("/v1/embeddings", json={"model": MINILM, "input": "word " * 300})
        unknown_token = http.post("/v1/embeddings", json={"model": MINILM, "input": [[10**6]]})
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    assert unknown_token.status_code == 400, unknown_token.text
