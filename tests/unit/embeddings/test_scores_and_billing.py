"""``/v1/rerank`` and ``/v1/score`` shapes, and what every pooling route bills and limits."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fakes.scripted_pooling import ScriptedPoolingEngine, words
from tests.fixtures.gateway import GatewayHarness
from tests.unit.audio.conftest import ledger_records
from tests.unit.embeddings.conftest import (
    BROKEN,
    EMBED,
    PRICE_PER_MTOK,
    RERANKER,
    SLOW,
    PoolingFactory,
)

QUERY = "cat on a mat"
DOCS = ["markets fell", "the cat sat on the mat", "a cat", "weather report"]
_ENGINE = ScriptedPoolingEngine()


def cosine(a: str, b: str) -> float:
    def vec(text: str) -> Any:
        return _ENGINE.vector(["[CLS]", *words(text), "[SEP]"], 64)

    return float(vec(a) @ vec(b))


def tokens(*texts: str) -> int:
    return sum(len(words(t)) + 2 for t in texts)


async def post(gw: GatewayHarness, path: str, body: dict[str, Any], **hdrs: str) -> httpx.Response:
    async with gw.client(gw.keys["user"]) as http:
        return await http.post(path, json=body, headers=hdrs)


async def test_rerank_sorts_by_relevance_with_indices(pool_gw: GatewayHarness) -> None:
    resp = await post(pool_gw, "/v1/rerank", {"model": EMBED, "query": QUERY, "documents": DOCS})
    assert resp.status_code == 200
    body = resp.json()
    assert (body["object"], body["model"]) == ("rerank", EMBED)
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert sorted(r["index"] for r in body["results"]) == [0, 1, 2, 3]
    for result in body["results"]:
        assert result["document"]["text"] == DOCS[result["index"]]
        assert result["relevance_score"] == pytest.approx(cosine(QUERY, DOCS[result["index"]]))
    assert {r["index"] for r in body["results"][-2:]} == {0, 3}  # no word in common
    assert body["usage"]["prompt_tokens"] == tokens(QUERY, *DOCS)


async def test_rerank_top_n_without_documents(pool_gw: GatewayHarness) -> None:
    body = {"model": RERANKER, "query": QUERY, "documents": DOCS, "top_n": 2}
    resp = await post(pool_gw, "/v1/rerank", {**body, "return_documents": False})
    results = resp.json()["results"]
    assert [r["index"] for r in results] == [2, 1]  # "a cat", then "the cat sat on the mat"
    assert all("document" not in r for r in results)


@pytest.mark.parametrize(
    ("text_1", "text_2", "pairs"),
    [
        ("cat", "a cat", [("cat", "a cat")]),
        (QUERY, DOCS, [(QUERY, d) for d in DOCS]),
        ([QUERY], DOCS[:2], [(QUERY, d) for d in DOCS[:2]]),
        (
            ["cat", "markets"],
            ["a cat", "markets fell"],
            [("cat", "a cat"), ("markets", "markets fell")],
        ),
    ],
)
async def test_score_shapes(
    pool_gw: GatewayHarness, text_1: Any, text_2: Any, pairs: list[tuple[str, str]]
) -> None:
    resp = await post(pool_gw, "/v1/score", {"model": EMBED, "text_1": text_1, "text_2": text_2})
    assert resp.status_code == 200
    body = resp.json()
    assert [d["index"] for d in body["data"]] == list(range(len(pairs)))
    assert [d["score"] for d in body["data"]] == pytest.approx([cosine(a, b) for a, b in pairs])
    queries = [text_1] if isinstance(text_1, str) else text_1
    documents = [text_2] if isinstance(text_2, str) else text_2
    assert body["usage"]["prompt_tokens"] == tokens(*queries, *documents)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_1"),
        ("/v1/score", {"text_1": "a", "text_2": []}, "text_2"),
        ("/v1/score", {"text_1": "", "text_2": "b"}, "text_1"),
        ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
        ("/v1/rerank", {"query": "q", "documents": ["a", ""]}, "documents[1]"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "rank_fields": ["x"]}, "rank_fields"),
    ],
)
async def test_score_refusals(
    pool_gw: GatewayHarness, path: str, body: dict[str, Any], param: str
) -> None:
    resp = await post(pool_gw, path, {"model": EMBED, **body})
    assert (resp.status_code, resp.json()["error"]["param"]) == (400, param), resp.text


async def test_an_embedding_only_model_is_refused_on_score(
    make_pooling_gateway: PoolingFactory,
) -> None:
    gw = await make_pooling_gateway()
    resp = await post(gw, "/v1/score", {"model": "scripted-chat", "text_1": "a", "text_2": "b"})
    assert resp.json()["error"]["code"] == "model_not_supported_for_endpoint"


async def test_input_tokens_go_to_the_ledger(pool_gw: GatewayHarness) -> None:
    await post(pool_gw, "/v1/embeddings", {"model": EMBED, "input": ["one two", "three"]})
    await post(pool_gw, "/v1/rerank", {"model": EMBED, "query": "q", "documents": ["d e"]})
    await post(pool_gw, "/v1/score", {"model": EMBED, "text_1": "a", "text_2": "b"})
    records = {r.route: r for r in await ledger_records(pool_gw, "alice")}
    assert set(records) == {"embeddings", "rerank", "score"}
    assert records["embeddings"].prompt_tokens == tokens("one two", "three")
    assert records["rerank"].prompt_tokens == tokens("q", "d e")
    assert records["score"].prompt_tokens == tokens("a", "b")
    for record in records.values():
        assert (record.model, record.status, record.completion_tokens) == (EMBED, "ok", 0)
        assert record.cost == pytest.approx(record.prompt_tokens * PRICE_PER_MTOK / 1e6)


async def test_limits_count_input_tokens(pool_gw: GatewayHarness) -> None:
    pool_gw.store.update_user("alice", rpm=10, tpm=20)
    first = await post(pool_gw, "/v1/embeddings", {"model": EMBED, "input": ["a b c d e f"] * 3})
    assert first.status_code == 200
    # Admitted on the estimate (11 characters: 3 tokens + 2 special, three times: 15 of 20),
    # then settled to the 24 tokens the model counted, which use the minute's 20 up.
    assert first.headers["x-ratelimit-limit-tokens"] == "20"
    assert first.headers["x-ratelimit-remaining-tokens"] == "5"
    assert first.headers["x-ratelimit-remaining-requests"] == "9"
    assert first.json()["usage"]["prompt_tokens"] == tokens("a b c d e f") * 3 == 24
    limited = await post(pool_gw, "/v1/embeddings", {"model": EMBED, "input": "a b c d e f"})
    assert (limited.status_code, limited.json()["error"]["code"]) == (429, "rate_limit_exceeded")
    assert len(await ledger_records(pool_gw, "alice")) == 1


async def test_idempotency_key_replays_without_billing_again(pool_gw: GatewayHarness) -> None:
    body = {"model": EMBED, "input": "same words"}
    first = await post(pool_gw, "/v1/embeddings", body, **{"Idempotency-Key": "k1"})
    again = await post(pool_gw, "/v1/embeddings", body, **{"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert len(await ledger_records(pool_gw, "alice")) == 1


async def test_head_failure_and_timeout_are_not_billed(
    make_pooling_gateway: PoolingFactory,
) -> None:
    gw = await make_pooling_gateway(embeddings={"timeout_s": 0.2})
    broken = await post(gw, "/v1/embeddings", {"model": BROKEN, "input": "x"})
    assert (broken.status_code, broken.json()["error"]["code"]) == (502, "upstream_error")
    slow = await post(gw, "/v1/rerank", {"model": SLOW, "query": "q", "documents": ["d"]})
    assert slow.status_code == 504
    assert await ledger_records(gw, "alice") == []
