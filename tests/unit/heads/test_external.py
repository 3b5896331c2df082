"""External providers against a real HTTP upstream on loopback (docs/reference/README.md,
docs/reference/common.md, docs/reference/chat.md#chat-request)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tests.fixtures.gateway import CATALOG, GatewayHarness, HarnessFactory
from tests.fixtures.waiting import wait_until

NOTICE = "Served by Example Provider outside our infrastructure."


def _unmetered(base: dict[str, Any], usage: dict[str, Any] | None) -> list[str]:
    """Sixteen bytes of text in two deltas, then ``usage`` (None: no usage chunk at all)."""
    events = [
        json.dumps({**base, "choices": [{"index": 0, "delta": {"content": word}}]})
        for word in ("Bonjour", " le monde")
    ]
    events.append(
        json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    )
    if usage is not None:
        events.append(json.dumps({**base, "choices": [], "usage": usage}))
    return [*events, "[DONE]"]


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

    def sse(*events: str) -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            for event in events:
                yield f"data: {event}\n\n".encode()

        return StreamingResponse(lines(), media_type="text/event-stream")

    base = {"id": "up-2", "object": "chat.completion.chunk", "created": 1, "model": "x"}
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    scripted: dict[str, Any] = {
        "garbage": lambda: sse("{not json"),
        "list-chunk": lambda: sse("[1, 2]"),
        "mid-error": lambda: sse(
            json.dumps({**base, "choices": [{"index": 0, "delta": {"content": "Hel"}}]}),
            json.dumps({"error": {"message": "provider fell over"}}),
        ),
        "json-body": lambda: JSONResponse(
            {
                **base,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": "Whole answer",
                            "tool_calls": [
                                {
                                    "id": f"call_{name}",
                                    "type": "function",
                                    "function": {"name": name, "arguments": "{}"},
                                }
                                for name in ("first", "second")
                            ],
                        },
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        ),
        "details": lambda: sse(
            json.dumps({**base, "choices": [{"index": 0, "delta": {"content": "ok"}}]}),
            json.dumps(
                {
                    **base,
                    "choices": [],
                    "usage": {
                        **usage,
                        "prompt_tokens_details": {"cached_tokens": 4},
                        "completion_tokens_details": {"reasoning_tokens": 0},
                    },
                }
            ),
            "[DONE]",
        ),
        "weird": lambda: sse(
            '{"choices": [{"index": "x", "delta": [1]}, 5, {"index": 0, "delta": '
            '{"content": "a\\ud800b", "tool_calls": [7, {"function": 3}]}}]}',
            '{"choices": [], "usage": {"prompt_tokens": "many", "completion_tokens": 1e400}}',
            "[DONE]",
        ),
        "no-usage": lambda: sse(*_unmetered(base, None)),
        "zero-usage": lambda: sse(*_unmetered(base, {"prompt_tokens": 0, "completion_tokens": 0})),
        "ctx-refuses": lambda: JSONResponse(
            {
                "error": {
                    "message": "This model's maximum context length is 10 tokens.",
                    "code": "context_length_exceeded",
                    "param": "messages",
                }
            },
            status_code=400,
        ),
    }

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        calls.append({"body": body, "auth": request.headers.get("authorization")})
        chunk = {"id": "up-3", "object": "text_completion", "created": 1, "model": "x"}
        return sse(
            json.dumps({**chunk, "choices": [{"index": 0, "text": "legacy text"}]}),
            json.dumps({**chunk, "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}),
            json.dumps({**chunk, "choices": [], "usage": usage}),
            "[DONE]",
        )

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        calls.append({"body": body, "auth": request.headers.get("authorization")})
        upstream_model = body["model"]
        if upstream_model in scripted:
            return scripted[upstream_model]()
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
    wait_until(lambda: server.started)
    yield f"http://127.0.0.1:{port}/v1", calls
    server.should_exit = True
    thread.join(timeout=5)


_SCRIPTED = (
    "garbage",
    "list-chunk",
    "mid-error",
    "json-body",
    "details",
    "weird",
    "ctx-refuses",
    "no-usage",
    "zero-usage",
)


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
) -> GatewayHarness:
    base = upstream[0]
    catalog = [m for m in CATALOG if m["id"] != "external-chat"] + [
        _external("ext-good", base, "good"),
        _external("ext-busy", base, "busy-then-ok"),
        _external("ext-broken", base, "broken"),
        _external("ext-refuses", base, "refuses"),
        _external("ext-slow", base, "slow", timeout_s=0.5),
        _external("ext-down", "http://127.0.0.1:9/v1", "x"),
        *(_external(f"ext-{name}", base, name) for name in _SCRIPTED),
        {
            **_external("ext-harmony", base, "good"),
            "reasoning": {"controllable": False, "separate_channel": True, "format": "harmony"},
        },
    ]
    return await make_gateway(
        {"catalog": catalog, "limits": {"rpm": 1000}},
        external_environ={"TEST_UPSTREAM_KEY": "sk-upstream-secret"},
    )


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


def _events(text: str) -> list[Any]:
    blocks = [b[len("data: ") :] for b in text.split("\n\n") if b.startswith("data: ")]
    return [b if b == "[DONE]" else json.loads(b) for b in blocks]


@pytest.mark.parametrize("model", ["ext-garbage", "ext-list-chunk"])
@pytest.mark.parametrize("stream", [False, True])
async def test_unreadable_provider_answer_is_502(
    gw: GatewayHarness, model: str, stream: bool
) -> None:
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(model, stream=stream))
    assert resp.status_code == 502
    assert resp.json()["error"]["code"] == "upstream_error"


async def test_provider_failing_mid_stream(gw: GatewayHarness) -> None:
    """An error event, then the disclosure chunk, then [DONE]; JSON callers get a 502."""
    async with gw.client(gw.keys["external"]) as http:
        streamed = await http.post("/v1/chat/completions", json=_chat("ext-mid-error", stream=True))
        whole = await http.post("/v1/chat/completions", json=_chat("ext-mid-error"))
    assert streamed.status_code == 200
    events = _events(streamed.text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[1]["choices"][0]["delta"]["content"] == "Hel"
    assert events[2]["error"]["code"] == "upstream_error"
    assert "provider fell over" in events[2]["error"]["message"]
    assert events[3]["choices"] == [] and events[3]["routing"]["residency"] == "external"
    assert events[4] == "[DONE]"
    assert whole.status_code == 502


async def test_provider_answering_one_json_body(gw: GatewayHarness) -> None:
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat("ext-json-body"))
    assert resp.status_code == 200
    body = resp.json()
    assert body["choices"][0]["message"]["content"] == "Whole answer"
    calls = body["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [
        ("call_first", "first"),
        ("call_second", "second"),
    ]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert body["routing"]["residency"] == "external"


async def test_usage_details_follow_the_card(gw: GatewayHarness) -> None:
    """cached_tokens as reported; reasoning_tokens never on a model without a reasoning
    channel, even when the provider reports a 0 (docs/reference/chat.md#usage)."""
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat("ext-details"))
        stream = await http.post(
            "/v1/chat/completions",
            json=_chat("ext-details", stream=True, stream_options={"include_usage": True}),
        )
    usage = resp.json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 4}
    assert "completion_tokens_details" not in usage
    streamed_usage = [e["usage"] for e in _events(stream.text)[:-1] if "usage" in e]
    assert streamed_usage == [usage]


async def test_provider_refusal_keeps_our_code_and_param(gw: GatewayHarness) -> None:
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat("ext-ctx-refuses"))
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["param"] == "messages"
    assert error["type"] == "invalid_request_error"


async def test_nonsense_from_the_provider_is_not_a_server_error(gw: GatewayHarness) -> None:
    for stream in (False, True):
        async with gw.client(gw.keys["external"]) as http:
            resp = await http.post("/v1/chat/completions", json=_chat("ext-weird", stream=stream))
        assert resp.status_code == 200
        assert "\\ud800" not in resp.text  # a lone surrogate is replaced, not echoed
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat("ext-weird"))
    assert resp.json()["choices"][0]["message"]["content"] == "a?b"
    # The provider's counts are no numbers: the gateway's own count bills the call ("hi": 2
    # bytes -> 1 token, + 4 for the message; "a?b": 1 token).
    assert resp.json()["usage"] == {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}


async def test_legacy_completions_disclosed_in_three_places(
    gw: GatewayHarness, upstream: tuple[str, list[dict[str, Any]]]
) -> None:
    client = gw.openai(gw.keys["external"])
    raw = await client.completions.with_raw_response.create(
        model="ext-good", prompt="say something", max_tokens=5
    )
    assert raw.headers["x-service-residency"] == "external"
    completion = raw.parse()
    assert completion.choices[0].text == "legacy text"
    assert (completion.model_extra or {})["routing"]["notice"] == NOTICE
    sent = upstream[1][-1]["body"]
    assert sent["prompt"] == ["say something"] and sent["max_tokens"] == 5
    stream = await client.completions.create(model="ext-good", prompt="say something", stream=True)
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "legacy text"
    assert (chunks[-1].model_extra or {})["routing"]["residency"] == "external"
    assert chunks[-1].choices == []


async def test_openai_sdk_reads_every_external_chunk(gw: GatewayHarness) -> None:
    client = gw.openai(gw.keys["external"])
    raw = await client.chat.completions.with_raw_response.create(
        model="ext-good",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers["x-service-residency"] == "external"
    chunks = [chunk async for chunk in raw.parse()]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from upstream"
    assert chunks[-2].usage is not None and chunks[-2].usage.total_tokens == 14
    routing = (chunks[-1].model_extra or {})["routing"]
    assert routing == {
        "provider_class": "external",
        "residency": "external",
        "notice": NOTICE,
        "region": "eu-west",
    }
    assert "pricing" not in (chunks[-1].model_extra or {})


async def test_harmony_grade_reaches_the_provider_as_reasoning_effort(
    gw: GatewayHarness, upstream: tuple[str, list[dict[str, Any]]]
) -> None:
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post(
            "/v1/chat/completions", json=_chat("ext-harmony", reasoning_effort="minimal")
        )
    assert resp.status_code == 200
    sent = upstream[1][-1]["body"]
    assert sent["reasoning_effort"] == "low"
    assert "chat_template_kwargs" not in sent


async def _ledger_records(gw: GatewayHarness) -> list[Any]:
    ledger = gw.app.state.gateway.text.metering.ledger
    assert ledger is not None
    await ledger.flush()
    user = gw.store.get_user("bob")
    assert user is not None
    return list(ledger.store.records_for(user.id))


@pytest.mark.parametrize("model", ["ext-no-usage", "ext-zero-usage"])
async def test_an_answer_without_usable_usage_is_billed_from_our_own_count(
    gw: GatewayHarness, model: str
) -> None:
    """docs/reference/common.md#external-models: a prompt of "hi" is 1 token by bytes / 4
    plus 4 for its message; "Bonjour le monde" (16 bytes) is 4 tokens."""
    expected = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    async with gw.client(gw.keys["external"]) as http:
        whole = await http.post("/v1/chat/completions", json=_chat(model))
        assert whole.status_code == 200
        assert whole.json()["choices"][0]["message"]["content"] == "Bonjour le monde"
        assert whole.json()["usage"] == expected
        assert [(r.prompt_tokens, r.completion_tokens) for r in await _ledger_records(gw)][-1] == (
            5,
            4,
        )
        stream = await http.post(
            "/v1/chat/completions",
            json=_chat(model, stream=True, stream_options={"include_usage": True}),
        )
    assert [e["usage"] for e in _events(stream.text)[:-1] if e.get("usage")] == [expected]
    record = (await _ledger_records(gw))[-1]
    assert (record.model, record.prompt_tokens, record.completion_tokens) == (model, 5, 4)
    assert record.cost == pytest.approx(5 * 3.0 / 1e6 + 4 * 6.0 / 1e6)


_UNSAFE_FIELDS = {
    "service_tier": "priority",
    "store": True,
    "metadata": {"k": "v"},
    "prediction": {"type": "content", "content": "x"},
    "logprobs": True,
    "top_k": 5,
    "safety_identifier": "someone",
}


@pytest.mark.parametrize("stream", [False, True])
async def test_only_known_fields_reach_the_provider(
    gw: GatewayHarness, upstream: tuple[str, list[dict[str, Any]]], stream: bool
) -> None:
    honoured = {
        "response_format": {"type": "text"},
        "logit_bias": {"15": -100},
        "parallel_tool_calls": False,
    }
    body = _chat("ext-good", stream=stream, temperature=0.5, **honoured, **_UNSAFE_FIELDS)
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200
    sent = upstream[1][-1]["body"]
    for name in _UNSAFE_FIELDS:
        assert name not in sent
    assert {k: sent[k] for k in honoured} == honoured
    assert sent["temperature"] == 0.5 and sent["messages"] == body["messages"]
    ignored = resp.headers["x-service-ignored-params"].split(", ")
    assert ignored == sorted(_UNSAFE_FIELDS)


async def test_only_known_fields_reach_the_provider_on_completions(
    gw: GatewayHarness, upstream: tuple[str, list[dict[str, Any]]]
) -> None:
    body = {
        "model": "ext-good",
        "prompt": "say something",
        "suffix": "!",
        "best_of": 4,
        "service_tier": "flex",
        "store": True,
    }
    async with gw.client(gw.keys["external"]) as http:
        resp = await http.post("/v1/completions", json=body)
    assert resp.status_code == 200
    sent = upstream[1][-1]["body"]
    assert sent["suffix"] == "!"
    assert not {"best_of", "service_tier", "store"} & set(sent)
    assert resp.headers["x-service-ignored-params"] == "best_of, service_tier, store"
