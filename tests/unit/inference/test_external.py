"""External providers against a real HTTP upstream on loopback (spec 1, 2.3, 4.1, 7)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tests.fixtures.gateway import CATALOG, GatewayHarness, HarnessFactory

NOTICE = "Served by Example Provider outside our infrastructure."


def _upstream_app(calls: list[dict[str, Any]]) -> FastAPI:
    app = FastAPI()
    state = {"busy": 0}

    async def chunks(body: dict[str, Any]) -> AsyncIterator[bytes]:
        base = {"id": "up-1", "object": "chat.completion.chunk", "created": 1, "model": "x"}
        for word in ["Hello", " from", " upstream"]:
            chunk = {**base, "choices": [{"index": 0, "delta": {"content": word}}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        final = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        yield f"data: {json.dumps(final)}\n\n".encode()
        usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        calls.append({"body": body, "auth": request.headers.get("authorization")})
        upstream_model = body["model"]
        if upstream_model == "busy-then-ok" and state["busy"] < 1:
            state["busy"] += 1
            return JSONResponse({"error": {"message": "busy"}}, status_code=503)
        if upstream_model == "broken":
            return JSONResponse({"error": {"message": "kaput"}}, status_code=500)
        if upstream_model == "refuses":
            return JSONResponse({"error": {"message": "prompt too long"}}, status_code=400)
        if upstream_model == "slow":
            await asyncio.sleep(3)
        return StreamingResponse(chunks(body), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    calls: list[dict[str, Any]] = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(_upstream_app(calls), host="127.0.0.1", port=port, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", calls
    server.should_exit = True
    thread.join(timeout=5)


def _external(model_id: str, base_url: str, upstream_model: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": model_id,
        "head": "chat",
        "context_length": 4096,
        "max_output_tokens": 256,
        "pricing": {"mode": "external", "input_per_mtok": 3.0, "output_per_mtok": 6.0},
        "external": {
            "base_url": base_url,
            "api_key_env": "TEST_UPSTREAM_KEY",
            "upstream_model": upstream_model,
            "notice": NOTICE,
            "region": "eu-west",
            **extra,
        },
    }


@pytest.fixture
async def gw(
    make_gateway: HarnessFactory,
    upstream: tuple[str, list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> GatewayHarness:
    monkeypatch.setenv("TEST_UPSTREAM_KEY", "sk-upstream-secret")
    base = upstream[0]
    catalog = [m for m in CATALOG if m["id"] != "external-chat"] + [
        _external("ext-good", base, "good"),
        _external("ext-busy", base, "busy-then-ok"),
        _external("ext-broken", base, "broken"),
        _external("ext-refuses", base, "refuses"),
        _external("ext-slow", base, "slow", timeout_s=0.5),
        _external("ext-down", "http://127.0.0.1:9/v1", "x"),
    ]
    return await make_gateway({"catalog": catalog, "limits": {"rpm": 1000}})


def _chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


async def test_not_enabled_org_gets_403_before_limits(gw: GatewayHarness) -> None:
    async with gw.client(gw.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat("ext-good"))
        listed = await http.get("/v1/models")
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "external_provider_not_enabled"
    assert resp.json()["error"]["param"] == "model"
    assert "ext-good" not in {m["id"] for m in listed.json()["data"]}


async def test_disclosed_in_header_and_body(
    gw: GatewayHarness, upstream: tuple[str, list[dict[str, Any]]]
) -> None:
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat("ext-good", max_tokens=7))
    assert resp.status_code == 200
    assert resp.headers["x-service-residency"] == "external"
    body = resp.json()
    assert body["routing"] == {
        "provider_class": "external",
        "residency": "external",
        "notice": NOTICE,
        "region": "eu-west",
    }
    assert "pricing" not in body
    assert body["choices"][0]["message"]["content"] == "Hello from upstream"
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    sent = upstream[1][-1]
    assert sent["auth"] == "Bearer sk-upstream-secret"
    assert sent["body"]["model"] == "good" and sent["body"]["max_tokens"] == 7
    assert sent["body"]["stream"] is True


async def test_stream_ends_with_one_routing_chunk(gw: GatewayHarness) -> None:
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post(
            "/v1/chat/completions",
            json=_chat("ext-good", stream=True, stream_options={"include_usage": True}),
        )
    blocks = [b[len("data: ") :] for b in resp.text.split("\n\n") if b]
    assert blocks[-1] == "[DONE]"
    routing_chunks = [json.loads(b) for b in blocks[:-1] if '"routing"' in b]
    assert len(routing_chunks) == 1
    assert json.loads(blocks[-2]) == routing_chunks[0]
    assert routing_chunks[0]["choices"] == []
    assert resp.headers["x-service-residency"] == "external"


async def test_own_fleet_has_no_disclosure(gw: GatewayHarness) -> None:
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat("scripted-chat"))
    assert "x-service-residency" not in resp.headers
    assert "routing" not in resp.json()


@pytest.mark.parametrize(
    ("model", "status", "code"),
    [
        ("ext-broken", 502, "upstream_error"),
        ("ext-refuses", 400, None),
        ("ext-slow", 504, "upstream_timeout"),
        ("ext-down", 503, "model_unavailable"),
    ],
)
async def test_upstream_errors_map_to_envelope(
    gw: GatewayHarness, model: str, status: int, code: str | None
) -> None:
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(model), timeout=30)
    assert resp.status_code == status
    assert set(resp.json()["error"]) == {"message", "type", "code", "param"}
    assert resp.json()["error"]["code"] == code


async def test_retry_only_on_busy_answer(
    gw: GatewayHarness, upstream: tuple[str, list[dict[str, Any]]]
) -> None:
    before = len(upstream[1])
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat("ext-busy"), timeout=30)
        broken = await http.post("/v1/chat/completions", json=_chat("ext-broken"), timeout=30)
    assert resp.status_code == 200
    calls = upstream[1][before:]
    assert [c["body"]["model"] for c in calls] == ["busy-then-ok", "busy-then-ok", "broken"]
    assert broken.status_code == 502


async def test_metered_at_external_price(gw: GatewayHarness) -> None:
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat("ext-good"))
    assert resp.status_code == 200
    ledger = gw.app.state.gateway.text.metering.ledger
    assert ledger is not None
    await ledger.flush()
    user = gw.store.get_user("bob")
    assert user is not None
    records = ledger.store.records_for(user.id)
    assert records and records[-1].model == "ext-good"
    assert records[-1].prompt_tokens == 11 and records[-1].completion_tokens == 3
    assert records[-1].pricing_mode == "external"
    assert records[-1].cost == pytest.approx(11 * 3.0 / 1e6 + 3 * 6.0 / 1e6)
