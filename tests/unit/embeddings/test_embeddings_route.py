"""``POST /v1/embeddings`` through the real app: shapes, order, encodings, refusals."""

from __future__ import annotations

import base64
import re
from typing import Any

import httpx
import numpy as np
import pytest

from tests.fakes.scripted_pooling import ScriptedPoolingEngine, words
from tests.fixtures.gateway import GatewayHarness
from tests.unit.audio.conftest import ledger_records
from tests.unit.embeddings.conftest import EMBED, MATRYOSHKA, RERANKER, PoolingFactory

TEXTS = ["the cat sat on the mat", "a cat on a mat", "stock markets fell today"]
_ENGINE = ScriptedPoolingEngine()


def expected(text: str, size: int = 64) -> np.ndarray:
    return _ENGINE.vector(["[CLS]", *words(text), "[SEP]"], size)


async def post(gw: GatewayHarness, body: dict[str, Any], **headers: str) -> httpx.Response:
    async with gw.client(gw.keys["user"]) as http:
        return await http.post("/v1/embeddings", json=body, headers=headers)


async def test_float_vectors_in_input_order_with_usage(pool_gw: GatewayHarness) -> None:
    resp = await post(pool_gw, {"model": EMBED, "input": TEXTS})
    assert resp.status_code == 200
    body = resp.json()
    assert (body["object"], body["model"]) == ("list", EMBED)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert {d["object"] for d in body["data"]} == {"embedding"}
    for item, text in zip(body["data"], TEXTS, strict=True):
        assert item["embedding"] == pytest.approx(expected(text).tolist(), abs=1e-6)
    tokens = sum(len(words(t)) + 2 for t in TEXTS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


async def test_float_vectors_are_the_float32_values_in_their_shortest_form(
    pool_gw: GatewayHarness,
) -> None:
    """Read back as float32 each number is the model's value exactly; none carries the
    17 digits of a float64 widening (at most 9 significant digits, the float32 bound)."""
    resp = await post(pool_gw, {"model": EMBED, "input": TEXTS})
    assert resp.status_code == 200
    for item, text in zip(resp.json()["data"], TEXTS, strict=True):
        assert np.array_equal(np.array(item["embedding"], dtype=np.float32), expected(text))
    numbers = re.findall(r"-?\d+\.\d+(?:e-?\d+)?", resp.text.split('"usage"')[0])
    assert numbers
    digits = [len(n.split("e")[0].lstrip("-").replace(".", "").lstrip("0")) for n in numbers]
    assert max(digits) <= 9


async def test_a_vector_that_is_not_finite_is_not_sent_as_null(
    pool_gw: GatewayHarness,
    pooling_heads: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broken model's NaN is the head's fault (502, unbilled), never a ``null``."""
    engine = pooling_heads[EMBED].core.engine
    real = engine.embed

    async def broken(request: Any) -> Any:
        result = await real(request)
        rows = np.frombuffer(result.vectors, dtype=np.float32).copy()
        rows[3] = np.nan
        result.vectors = rows.tobytes()
        return result

    monkeypatch.setattr(engine, "embed", broken)
    resp = await post(pool_gw, {"model": EMBED, "input": TEXTS})
    assert (resp.status_code, resp.json()["error"]["code"]) == (502, "upstream_error")
    assert "not finite" in resp.json()["error"]["message"]
    assert await ledger_records(pool_gw, "alice") == []


async def test_base64_is_the_float32_bytes_of_the_same_vectors(pool_gw: GatewayHarness) -> None:
    resp = await post(pool_gw, {"model": EMBED, "input": TEXTS, "encoding_format": "base64"})
    assert resp.status_code == 200
    for item, text in zip(resp.json()["data"], TEXTS, strict=True):
        decoded = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert decoded.tolist() == pytest.approx(expected(text).tolist(), abs=1e-6)


async def test_a_single_string(pool_gw: GatewayHarness) -> None:
    resp = await post(pool_gw, {"model": EMBED, "input": "hello world", "user": "u-1"})
    assert resp.status_code == 200
    [item] = resp.json()["data"]
    assert item["embedding"] == pytest.approx(expected("hello world").tolist(), abs=1e-6)
    assert "x-service-ignored-params" not in resp.headers


@pytest.mark.parametrize("ids", [[5, 6, 7], [[5, 6, 7], [8, 9]]])
async def test_token_ids(pool_gw: GatewayHarness, ids: list[Any]) -> None:
    resp = await post(pool_gw, {"model": EMBED, "input": ids})
    assert resp.status_code == 200
    rows = ids if isinstance(ids[0], list) else [ids]
    assert len(resp.json()["data"]) == len(rows)
    for item, row in zip(resp.json()["data"], rows, strict=True):
        want = _ENGINE.vector([f"#{t}" for t in row], 64)
        assert item["embedding"] == pytest.approx(want.tolist(), abs=1e-6)
    assert resp.json()["usage"]["prompt_tokens"] == sum(len(r) for r in rows)


async def test_openai_sdk_float_and_base64(pool_gw: GatewayHarness) -> None:
    client = pool_gw.openai(pool_gw.keys["user"])
    # The SDK asks for base64 when no format is given and decodes it itself.
    default = await client.embeddings.create(model=EMBED, input=TEXTS)
    floats = await client.embeddings.create(model=EMBED, input=TEXTS, encoding_format="float")
    for a, b, text in zip(default.data, floats.data, TEXTS, strict=True):
        assert a.embedding == pytest.approx(expected(text).tolist(), abs=1e-6)
        assert b.embedding == pytest.approx(a.embedding, abs=1e-6)
    assert default.usage.prompt_tokens == floats.usage.prompt_tokens > 0


async def test_matryoshka_dimensions(pool_gw: GatewayHarness) -> None:
    resp = await post(pool_gw, {"model": MATRYOSHKA, "input": "a b c", "dimensions": 16})
    assert resp.status_code == 200
    assert len(resp.json()["data"][0]["embedding"]) == 16
    full = await post(pool_gw, {"model": EMBED, "input": "a b c", "dimensions": 64})
    assert len(full.json()["data"][0]["embedding"]) == 64  # the model's own length: a no-op


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"input": ""}, "invalid_value", "input"),
        ({"input": []}, "invalid_value", "input"),
        ({"input": ["ok", ""]}, "invalid_value", "input[1]"),
        ({"input": ["ok", 3]}, "invalid_value", "input[1]"),
        ({"input": [[1, 2], [3, "x"]]}, "invalid_value", "input[1][1]"),
        ({"input": [1, 2.5]}, "invalid_value", "input[1]"),
        ({"input": [1, True]}, "invalid_value", "input[1]"),
        ({"input": [[1], []]}, "invalid_value", "input[1]"),
        ({"input": [-1]}, "invalid_value", "input[0]"),
        ({"input": {"text": "x"}}, "invalid_value", "input"),
        ({"input": " ".join(["w"] * 40)}, "context_length_exceeded", "input"),
        ({"input": [[5000]]}, "invalid_value", "input"),
        ({"input": "x", "dimensions": 16}, "unsupported_parameter", "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "invalid_value", "encoding_format"),
        (
            {"input": "x", "truncate_prompt_tokens": 4},
            "unknown_parameter",
            "truncate_prompt_tokens",
        ),
    ],
)
async def test_refusals(
    pool_gw: GatewayHarness, body: dict[str, Any], code: str, param: str
) -> None:
    resp = await post(pool_gw, {"model": EMBED, **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)


async def test_matryoshka_length_not_trained_for(pool_gw: GatewayHarness) -> None:
    resp = await post(pool_gw, {"model": MATRYOSHKA, "input": "x", "dimensions": 5})
    error = resp.json()["error"]
    assert (resp.status_code, error["code"], error["param"]) == (400, "invalid_value", "dimensions")
    assert "16, 32" in error["message"]


async def test_input_count_is_bounded(make_pooling_gateway: PoolingFactory) -> None:
    gw = await make_pooling_gateway(embeddings={"max_inputs": 3})
    assert (await post(gw, {"model": EMBED, "input": ["a"] * 3})).status_code == 200
    resp = await post(gw, {"model": EMBED, "input": ["a"] * 4})
    assert (resp.status_code, resp.json()["error"]["param"]) == (400, "input")
    assert "at most 3" in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    ("model", "status", "code", "route"),
    [
        ("scripted-chat", 400, "model_not_supported_for_endpoint", "/v1/chat/completions"),
        (RERANKER, 400, "model_not_supported_for_endpoint", "/v1/rerank"),
        ("no-such-model", 404, "model_not_found", None),
    ],
)
async def test_wrong_models(
    pool_gw: GatewayHarness, model: str, status: int, code: str, route: str | None
) -> None:
    resp = await post(pool_gw, {"model": model, "input": "x"})
    assert (resp.status_code, resp.json()["error"]["code"]) == (status, code)
    if route:
        assert route in resp.json()["error"]["message"]


async def test_an_embedding_model_on_chat_names_its_route(pool_gw: GatewayHarness) -> None:
    async with pool_gw.client(pool_gw.keys["user"]) as http:
        resp = await http.post(
            "/v1/chat/completions",
            json={"model": EMBED, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "model_not_supported_for_endpoint"
    assert "/v1/embeddings" in resp.json()["error"]["message"]


async def test_needs_a_key(pool_gw: GatewayHarness) -> None:
    async with pool_gw.client() as http:
        resp = await http.post("/v1/embeddings", json={"model": EMBED, "input": "x"})
    assert resp.status_code == 401


async def test_the_catalog_card(pool_gw: GatewayHarness) -> None:
    async with pool_gw.client(pool_gw.keys["user"]) as http:
        card = (await http.get(f"/v1/models/{MATRYOSHKA}")).json()
    assert card["architecture"]["output_modalities"] == ["embedding", "score"]
    assert card["pooling"] == {
        "dimensions": 64,
        "matryoshka_dimensions": [16, 32],
        "score": "bi-encoder",
        "truncates": False,
    }
    assert "supported_parameters" not in card  # chat models only (the contract's card)
    assert card["pricing"]["input_per_mtok"] == 2.0
