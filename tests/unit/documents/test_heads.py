"""Every document head answers through its real inference code, with the shapes of docs/api.md."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.contract.documents import (
    DetectHeadReply,
    DetectHeadRequest,
    ParseHeadReply,
    ParseHeadRequest,
)
from serve_app.heads.client import DocumentClient
from tests.fixtures.gateway import GatewayHarness
from tests.unit.audio.conftest import ledger_records
from tests.unit.documents.conftest import (
    SENTENCE,
    TABLE,
    b64,
    bar_chart,
    data_uri,
    formula_image,
    page_with_table,
    sentence_image,
)

_FIELDS = {"text", "table", "tables", "output"}


async def _post(gw: GatewayHarness, path: str, body: dict[str, Any]) -> Any:
    async with gw.client(gw.keys["user"]) as client:
        return await client.post(path, json=body)


def _only_field(body: dict[str, Any], expected: str) -> Any:
    """docs/reference/documents.md#parse: exactly one of text/table/tables/output."""
    assert _FIELDS & set(body) == {expected}, body
    assert body["usage"] == {"images": 1}
    return body[expected]


async def test_ocr_reads_a_rendered_sentence(doc_gw: GatewayHarness) -> None:
    reply = await _post(doc_gw, "/v1/parse", {"model": "got-ocr-2", "image": b64(sentence_image())})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == "got-ocr-2" and body["object"] == "parse"
    assert " ".join(_only_field(body, "text").split()) == SENTENCE


async def test_detect_finds_the_table_on_a_page(doc_gw: GatewayHarness) -> None:
    page, (x0, y0, x1, y1) = page_with_table()
    reply = await _post(doc_gw, "/v1/detect", {"model": "tatr", "image": data_uri(page)})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["usage"] == {"images": 1} and body["object"] == "detection"
    [region] = body["regions"]
    assert region["label"] == "table" and 0.5 <= region["score"] <= 1
    bx0, by0, bx1, by1 = region["box"]
    assert abs(bx0 - x0) < 30 and abs(by0 - y0) < 30 and abs(bx1 - x1) < 30 and abs(by1 - y1) < 30


async def test_table_transformer_code_path_returns_regions(doc_gw: GatewayHarness) -> None:
    """Random weights: only the shape is meaningful (threshold 0 keeps every query)."""
    page, _ = page_with_table()
    reply = await _post(doc_gw, "/v1/detect", {"model": "tatr-hf", "image": b64(page)})
    assert reply.status_code == 200, reply.text
    regions = reply.json()["regions"]
    assert regions and all(r["label"] in ("table", "table rotated") for r in regions)
    for r in regions:
        assert len(r["box"]) == 4 and 0 <= r["score"] <= 1


async def test_detect_then_tableformer_pipeline(doc_gw: GatewayHarness) -> None:
    page, _ = page_with_table()
    image = b64(page)
    detected = (await _post(doc_gw, "/v1/detect", {"model": "tatr", "image": image})).json()
    boxes = [r["box"] for r in detected["regions"]]
    reply = await _post(
        doc_gw, "/v1/parse", {"model": "tableformer", "image": image, "table_bboxes": boxes}
    )
    assert reply.status_code == 200, reply.text
    [html] = _only_field(reply.json(), "tables")
    assert html.startswith("<table>") and html.count("<tr>") == len(TABLE)
    for row in TABLE:
        for cell in row:
            assert f"<td>{cell}</td>" in html


@pytest.mark.parametrize(
    ("model", "field", "image"),
    [
        ("trocr", "text", sentence_image),
        ("pix2text", "output", formula_image),
        ("deplot", "table", bar_chart),
    ],
)
async def test_transformers_heads_generate(
    doc_gw: GatewayHarness, model: str, field: str, image: Any
) -> None:
    """Tiny random weights: the text is random, the field and its type are not."""
    reply = await _post(doc_gw, "/v1/parse", {"model": model, "image": b64(image())})
    assert reply.status_code == 200, reply.text
    assert isinstance(_only_field(reply.json(), field), str)


class _Spy:
    """Records what the gateway sends the head, then forwards it."""

    def __init__(self, inner: DocumentClient) -> None:
        self.inner = inner
        self.sent: list[ParseHeadRequest] = []

    async def detect(self, request: DetectHeadRequest) -> DetectHeadReply:
        return await self.inner.detect(request)

    async def parse(self, request: ParseHeadRequest) -> ParseHeadReply:
        self.sent.append(request)
        return await self.inner.parse(request)


@pytest.mark.parametrize(("asked", "sent"), [(10_000, 8), (3, 3), (None, 8)])
async def test_max_new_tokens_is_clamped_to_the_model_bound(
    doc_gw: GatewayHarness, asked: int | None, sent: int
) -> None:
    """trocr's catalog bound is 8: above it is served at 8, not refused; omitted means 8."""
    service = doc_gw.app.state.gateway.documents
    spy = _Spy(service.heads["trocr"])
    service.heads = {**service.heads, "trocr": spy}
    body: dict[str, Any] = {"model": "trocr", "image": b64(sentence_image())}
    if asked is not None:
        body["max_new_tokens"] = asked
    reply = await _post(doc_gw, "/v1/parse", body)
    assert reply.status_code == 200, reply.text
    assert [r.max_new_tokens for r in spy.sent] == [sent]


async def test_each_processed_image_is_billed(doc_gw: GatewayHarness) -> None:
    await _post(doc_gw, "/v1/parse", {"model": "got-ocr-2", "image": b64(sentence_image())})
    await _post(doc_gw, "/v1/detect", {"model": "tatr", "image": b64(page_with_table()[0])})
    records = await ledger_records(doc_gw, "alice")
    assert sorted((r.model, r.route, r.images) for r in records) == [
        ("got-ocr-2", "parse", 1),
        ("tatr", "detect", 1),
    ]
    assert all(abs(r.cost - 0.01) < 1e-9 for r in records)
