"""Every refusal of /v1/detect and /v1/parse, checked before (or instead of) a head call."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import pytest
from PIL import Image

from tests.fixtures.gateway import GatewayHarness
from tests.unit.audio.conftest import ledger_records
from tests.unit.documents.conftest import DocFactory, b64, page_with_table, sentence_image

PNG = b64(sentence_image())


async def _post(gw: GatewayHarness, path: str, body: dict[str, Any], key: str = "user") -> Any:
    async with gw.client(gw.keys[key]) as client:
        return await client.post(path, json=body)


def _error(reply: Any, status: int, code: str, param: str | None = None) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(("path", "model"), [("/v1/detect", "tatr"), ("/v1/parse", "got-ocr-2")])
async def test_stream_true_is_refused(doc_gw: GatewayHarness, path: str, model: str) -> None:
    reply = await _post(doc_gw, path, {"model": model, "image": PNG, "stream": True})
    _error(reply, 400, "unsupported_parameter", "stream")


async def test_stream_false_is_served(doc_gw: GatewayHarness) -> None:
    reply = await _post(doc_gw, "/v1/detect", {"model": "tatr", "image": PNG, "stream": False})
    assert reply.status_code == 200, reply.text


async def test_tableformer_without_boxes_is_refused_before_the_image_is_read(
    doc_gw: GatewayHarness,
) -> None:
    """Refused at once: even a broken image is not looked at first, no head is called."""
    extras: list[dict[str, Any]] = [{}, {"table_bboxes": []}]
    for body in extras:
        reply = await _post(
            doc_gw, "/v1/parse", {"model": "tableformer", "image": "not base64!", **body}
        )
        _error(reply, 400, "missing_required_parameter", "table_bboxes")


async def test_table_boxes_must_have_four_numbers(doc_gw: GatewayHarness) -> None:
    reply = await _post(
        doc_gw, "/v1/parse", {"model": "tableformer", "image": PNG, "table_bboxes": [[1, 2, 3]]}
    )
    assert reply.status_code == 400


async def test_other_parse_heads_ignore_table_bboxes(doc_gw: GatewayHarness) -> None:
    reply = await _post(
        doc_gw, "/v1/parse", {"model": "got-ocr-2", "image": PNG, "table_bboxes": [[0, 0, 5, 5]]}
    )
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    "image",
    [
        "not base64!",
        base64.b64encode(b"plain text, not an image").decode(),
        "data:image/png;base64,AAAA",
        "data:text/plain,hello",
        base64.b64encode(base64.b64decode(PNG)[:60]).decode(),  # truncated PNG
    ],
)
@pytest.mark.parametrize(("path", "model"), [("/v1/detect", "tatr"), ("/v1/parse", "trocr")])
async def test_bad_images_are_invalid_image(
    doc_gw: GatewayHarness, path: str, model: str, image: str
) -> None:
    reply = await _post(doc_gw, path, {"model": model, "image": image})
    _error(reply, 400, "invalid_image", "image")


async def test_image_type_comes_from_the_bytes_not_the_uri(doc_gw: GatewayHarness) -> None:
    """A PNG declared as JPEG is read as the PNG it is."""
    reply = await _post(
        doc_gw, "/v1/parse", {"model": "got-ocr-2", "image": f"data:image/jpeg;base64,{PNG}"}
    )
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    ("path", "model", "route"),
    [
        ("/v1/detect", "scripted-chat", "/v1/chat/completions"),
        ("/v1/parse", "scripted-chat", "/v1/chat/completions"),
        ("/v1/detect", "got-ocr-2", "/v1/parse"),
        ("/v1/parse", "tatr", "/v1/detect"),
    ],
)
async def test_model_of_another_route(
    doc_gw: GatewayHarness, path: str, model: str, route: str
) -> None:
    reply = await _post(doc_gw, path, {"model": model, "image": PNG})
    assert route in _error(reply, 400, "model_not_supported_for_endpoint", "model")["message"]


@pytest.mark.parametrize(("model", "route"), [("tatr", "/v1/detect"), ("trocr", "/v1/parse")])
async def test_document_model_on_chat(doc_gw: GatewayHarness, model: str, route: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    reply = await _post(doc_gw, "/v1/chat/completions", body)
    assert route in _error(reply, 400, "model_not_supported_for_endpoint", "model")["message"]


async def test_unknown_model_and_missing_key(doc_gw: GatewayHarness) -> None:
    _error(
        await _post(doc_gw, "/v1/parse", {"model": "nope", "image": PNG}), 404, "model_not_found"
    )
    async with doc_gw.client() as client:
        reply = await client.post("/v1/detect", json={"model": "tatr", "image": PNG})
    _error(reply, 401, "invalid_api_key")


async def test_missing_image_is_400(doc_gw: GatewayHarness) -> None:
    reply = await _post(doc_gw, "/v1/detect", {"model": "tatr"})
    assert reply.status_code == 400


async def test_head_timeout_is_504_and_unbilled(make_doc_gateway: DocFactory) -> None:
    gw = await make_doc_gateway(documents={"parse_timeout_s": 0.2})
    reply = await _post(gw, "/v1/parse", {"model": "slow-parse", "image": PNG})
    _error(reply, 504, "upstream_timeout")
    assert await ledger_records(gw, "alice") == []


async def test_head_failure_is_502(doc_gw: GatewayHarness) -> None:
    reply = await _post(doc_gw, "/v1/parse", {"model": "broken-parse", "image": PNG})
    _error(reply, 502, "upstream_error")


async def test_unknown_fields_are_named_in_the_ignored_header(doc_gw: GatewayHarness) -> None:
    page, _ = page_with_table()
    reply = await _post(doc_gw, "/v1/detect", {"model": "tatr", "image": b64(page), "dpi": 300})
    assert reply.status_code == 200
    assert reply.headers["x-service-ignored-params"] == "dpi"


@pytest.mark.parametrize(
    "image",
    [
        "data:image/png;base64," + "\n".join(PNG[i : i + 76] for i in range(0, len(PNG), 76)),
        base64.urlsafe_b64encode(base64.b64decode(PNG)).decode().rstrip("="),
        "DATA:image/png;BASE64," + PNG,
        f"  data:image/png;base64, {PNG} \n",
    ],
    ids=["wrapped-data-uri", "urlsafe-unpadded", "upper-case-scheme", "padded-with-spaces"],
)
async def test_base64_spellings_are_accepted(doc_gw: GatewayHarness, image: str) -> None:
    """Line-wrapped (MIME) base64, the URL-safe alphabet and a case-insensitive scheme
    all carry the same bytes: the image is judged by its bytes, not its spelling."""
    reply = await _post(doc_gw, "/v1/detect", {"model": "tatr", "image": image})
    assert reply.status_code == 200, reply.text


async def test_decompression_bomb_is_invalid_image(doc_gw: GatewayHarness) -> None:
    """A 12000 x 12000 PNG is ~17 KB on the wire and 432 MB decoded: refused, not decoded."""
    buffer = io.BytesIO()
    Image.new("1", (12_000, 12_000), 0).save(buffer, format="PNG")
    image = base64.b64encode(buffer.getvalue()).decode()
    for path, model in (("/v1/detect", "tatr"), ("/v1/parse", "got-ocr-2")):
        reply = await _post(doc_gw, path, {"model": model, "image": image})
        assert "pixels" in _error(reply, 400, "invalid_image", "image")["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -5}, "max_new_tokens"),
        ({"max_new_tokens": "5"}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"max_new_tokens": 5.5}, "max_new_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"stream": "no"}, "stream"),
        ({"stream": 1}, "stream"),
    ],
)
async def test_fields_of_the_wrong_type_are_400(
    doc_gw: GatewayHarness, extra: dict[str, Any], param: str
) -> None:
    """No coercion: a string or a boolean is not a token count, a string is not a switch."""
    reply = await _post(doc_gw, "/v1/parse", {"model": "trocr", "image": PNG, **extra})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


_W, _H = page_with_table()[0].size


@pytest.mark.parametrize(
    "box",
    [
        "[-10, -10, 50, 50]",
        f"[0, 0, {_W * 2}, {_H * 2}]",
        f"[{_W + 10}, {_H + 10}, {_W + 90}, {_H + 90}]",
        "[100, 100, 50, 50]",
        "[10, 10, 10, 10]",
        "[NaN, 0, 10, 10]",
        "[0, 0, Infinity, 10]",
        "[1e308, 0, 1, 1]",
    ],
    ids=["negative", "past-the-edge", "outside", "inverted", "empty", "nan", "infinity", "huge"],
)
async def test_table_boxes_outside_the_image_are_400(doc_gw: GatewayHarness, box: str) -> None:
    """A box must be finite pixels with 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height;
    anything else is the caller's mistake (400 naming the box), never an empty table or 502."""
    page, table = page_with_table()
    good = json.dumps(list(table))
    raw = (
        f'{{"model": "tableformer", "image": "{b64(page)}", "table_bboxes": [{good}, {box}]}}'
    ).encode()
    async with doc_gw.client(doc_gw.keys["user"]) as client:
        reply = await client.post(
            "/v1/parse", content=raw, headers={"content-type": "application/json"}
        )
    _error(reply, 400, "invalid_value", "table_bboxes[1]")


async def test_a_full_page_box_is_accepted(doc_gw: GatewayHarness) -> None:
    page, _ = page_with_table()
    body = {"model": "tableformer", "image": b64(page), "table_bboxes": [[0, 0, _W, _H]]}
    reply = await _post(doc_gw, "/v1/parse", body)
    assert reply.status_code == 200, reply.text
