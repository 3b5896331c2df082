"""A service's answer becomes the same HTTP response the service used to build itself.

``http_response`` is the one place an ``Answer`` turns into Starlette's response: the
status, every header (names, values, order) and the body bytes must be what the
``JSONResponse`` / ``PlainTextResponse`` / ``Response`` the services built before wrote
(one exception: a float in exponent form is written 1e-7, not 1e-07; the same number).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from starlette.responses import JSONResponse, PlainTextResponse, Response

from serve_app.inference.answers import Body, FrameStream
from serve_app.inference.sse import SSE_HEADERS
from serve_app.routes.answers import MeteredStreamingResponse, http_response

HEADERS = {"x-service-ignored-params": "logit_bias, user", "X-Service-Residency": "external"}


def _same(built: Response, before: Response) -> None:
    assert built.status_code == before.status_code
    assert built.raw_headers == before.raw_headers
    assert built.body == before.body


@pytest.mark.parametrize(
    "payload",
    [
        {"object": "list", "data": [{"index": 0, "embedding": [0.5, -1.25, 3e-3]}]},
        {"text": "naïve café — 日本語 \u2028 NaN", "nested": {"none": None, "flag": True}},
        {"big": 2**70, "key": {3: "int keys become strings"}},
        [],
    ],
)
@pytest.mark.parametrize("status_code, headers", [(200, None), (202, HEADERS)])
def test_a_json_body_is_what_json_response_wrote(
    payload: Any, status_code: int, headers: dict[str, str] | None
) -> None:
    built = http_response(Body.json(payload, status_code=status_code, headers=headers))
    _same(built, JSONResponse(payload, status_code=status_code, headers=headers))


def test_floats_in_exponent_form_keep_their_value() -> None:
    """pydantic-core writes 1.25e-7 where the standard library wrote 1.25e-07: the same
    number, every digit kept (an embedding's float32 values survive exactly)."""
    values = [-1.25e-07, 1e-05, 1e16, 0.1 + 0.2, float(np.float32(0.0123456789))]
    assert json.loads(Body.json({"embedding": values}).content) == {"embedding": values}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_json_body_refuses_nan_as_json_response_did(bad: float) -> None:
    with pytest.raises(ValueError):
        Body.json({"x": [1.0, bad]})


def test_text_and_audio_bodies_keep_their_media_types() -> None:
    text = http_response(Body("héllo".encode(), HEADERS, media_type="text/plain"))
    _same(text, PlainTextResponse("héllo", headers=HEADERS))
    wav = http_response(Body(b"RIFF\x00\x01", {"x-service-voice": "alloy"}, media_type="audio/wav"))
    _same(
        wav, Response(b"RIFF\x00\x01", media_type="audio/wav", headers={"x-service-voice": "alloy"})
    )
    serialized = b'{"id":"chatcmpl-1"}'
    chat = http_response(Body(serialized, HEADERS))
    _same(chat, Response(serialized, media_type="application/json", headers=HEADERS))


async def test_a_frame_stream_is_a_metered_event_stream() -> None:
    released: list[bool] = []

    async def frames() -> AsyncIterator[bytes]:
        yield b"data: {}\n\n"

    async def release() -> None:
        released.append(True)

    source = frames()
    built = http_response(FrameStream(source, release, {**SSE_HEADERS, **HEADERS}))
    assert isinstance(built, MeteredStreamingResponse)
    before = MeteredStreamingResponse(
        source, release=release, media_type="text/event-stream", headers={**SSE_HEADERS, **HEADERS}
    )
    assert built.status_code == before.status_code == 200
    assert built.raw_headers == before.raw_headers
    assert (b"content-type", b"text/event-stream; charset=utf-8") in built.raw_headers
