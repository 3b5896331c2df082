"""``/v1/messages`` on the in-process app with scripted heads, driven by the anthropic SDK
and raw HTTP (docs/reference/messages.md)."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import anthropic
import httpx
import httpx2
import pytest
from PIL import Image

from serve_app.ingress.app import create_app
from serve_app.limits.memory import InProcessCounterStore
from tests.fixtures.gateway import GatewayHarness, HarnessFactory, add_keys
from tests.fixtures.limits import ManualClock
from tests.unit.ingress.leaving_client import stream_then_leave
from tests.unit.messages.helpers import ledger_rows, named_events, request, sdk, user

CHAT = "scripted-chat"
TOOLS = "scripted-tools"


def _png() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


async def test_create_answers_a_message_with_usage(gateway: GatewayHarness) -> None:
    client = sdk(gateway, gateway.keys["user"])
    message = await client.messages.create(
        model=CHAT, max_tokens=16, messages=[{"role": "user", "content": "hello there"}]
    )
    assert message.id.startswith("msg_")
    assert (message.role, message.model, message.stop_reason) == ("assistant", CHAT, "end_turn")
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "hello there"  # type: ignore[union-attr]
    ((prompt, completion),) = gateway.engines[CHAT].produced.values()
    assert (message.usage.input_tokens, message.usage.output_tokens) == (prompt, completion)
    assert message.usage.cache_read_input_tokens == 0


@pytest.mark.parametrize("header", ["x-api-key", "authorization"])
async def test_both_anthropic_auth_headers_are_accepted(
    gateway: GatewayHarness, header: str
) -> None:
    key = gateway.keys["user"]
    value = key if header == "x-api-key" else f"Bearer {key}"
    async with gateway.client() as http:
        resp = await http.post(
            "/v1/messages",
            json=request(CHAT, "hi"),
            headers={header: value, "anthropic-version": "2023-06-01"},
        )
    assert resp.status_code == 200, resp.text
    assert resp.json()["type"] == "message"


async def test_sdk_auth_token_is_bearer(gateway: GatewayHarness) -> None:
    client = anthropic.AsyncAnthropic(
        auth_token=gateway.keys["user"],
        base_url="http://gateway.test",
        http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=gateway.app)),
        max_retries=0,
    )
    message = await client.messages.create(model=CHAT, max_tokens=4, messages=[user("hi")])
    assert message.stop_reason == "end_turn"


async def test_errors_are_the_sdk_exception_classes(gateway: GatewayHarness) -> None:
    good = sdk(gateway, gateway.keys["user"])
    with pytest.raises(anthropic.AuthenticationError) as auth:
        await sdk(gateway, "gwk_" + "0" * 40).messages.create(
            model=CHAT, max_tokens=4, messages=[user("hi")]
        )
    assert auth.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.PermissionDeniedError):
        await sdk(gateway, gateway.keys["no_scope"]).messages.create(
            model=CHAT, max_tokens=4, messages=[user("hi")]
        )
    with pytest.raises(anthropic.NotFoundError) as missing:
        await good.messages.create(model="nope", max_tokens=4, messages=[user("hi")])
    assert missing.value.body == {  # Anthropic's envelope, nothing else
        "type": "error",
        "error": {"type": "not_found_error", "message": missing.value.body["error"]["message"]},  # type: ignore[index]
    }
    with pytest.raises(anthropic.BadRequestError) as bad:
        await good.messages.create(model=CHAT, max_tokens=0, messages=[user("hi")])
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "max_tokens" in bad.value.message


async def test_max_tokens_is_required(gateway: GatewayHarness) -> None:
    body = {"model": CHAT, "messages": [user("hi")]}
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/messages", json=body)
        chat = await http.post("/v1/chat/completions", json={**body, "model": "nope"})
    assert resp.status_code == 400
    assert resp.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "Missing required parameter: 'max_tokens'.",
        },
    }
    # The rest of /v1 keeps the OpenAI envelope.
    assert chat.json()["error"]["code"] == "model_not_found"


async def test_unknown_route_under_messages_is_anthropic_404(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/messages/batches", json={})
    assert resp.status_code in (404, 405)
    assert resp.json()["type"] == "error"


async def test_body_over_the_limit_is_request_too_large(sync_gateway: GatewayHarness) -> None:
    small = create_app(sync_gateway.app.state.gateway, max_body_bytes=2048)
    transport = httpx.ASGITransport(app=small)
    add_keys(sync_gateway)
    key = {"x-api-key": sync_gateway.keys["user"]}  # a keyless body is a 401 before any read
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=key) as http:
        resp = await http.post("/v1/messages", json=request(CHAT, "x" * 5000))
    assert resp.status_code == 413
    assert resp.json()["error"]["type"] == "request_too_large"


async def test_rate_limit_is_429_with_retry_after(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(counters=InProcessCounterStore(clock=ManualClock()))
    gw.store.update_user("alice", rpm=1)
    client = sdk(gw, gw.keys["user"])
    await client.messages.create(model=CHAT, max_tokens=4, messages=[user("hi")])
    with pytest.raises(anthropic.RateLimitError) as limited:
        await client.messages.create(model=CHAT, max_tokens=4, messages=[user("hi")])
    assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert int(limited.value.response.headers["retry-after"]) > 0


async def test_warming_model_is_overloaded_with_retry_after(gateway: GatewayHarness) -> None:
    readiness = gateway.app.state.gateway.text.readiness
    readiness.check = _warming  # the head reports itself starting
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/messages", json=request(CHAT, "hi"))
    assert resp.status_code == 503
    assert resp.json()["error"]["type"] == "overloaded_error"
    assert resp.headers["retry-after"] == "7"


def _warming(head_id: str) -> None:
    from serve_app.protocol.errors import model_warming

    raise model_warming(head_id, 7)


async def test_max_tokens_and_stop_sequence_stop_reasons(gateway: GatewayHarness) -> None:
    client = sdk(gateway, gateway.keys["user"])
    cut = await client.messages.create(model=CHAT, max_tokens=2, messages=[user("a b c d")])
    assert (cut.stop_reason, cut.usage.output_tokens) == ("max_tokens", 2)
    stopped = await client.messages.create(
        model=CHAT, max_tokens=16, messages=[user("a b c d")], stop_sequences=["c"]
    )
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "c")
    assert stopped.content[0].text == "a b "  # type: ignore[union-attr]
    sampling = gateway.engines[CHAT].seen[-1][1]
    assert sampling.stop == ["c"]


async def test_sampling_fields_reach_the_engine(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(
            "/v1/messages",
            json=request(
                CHAT,
                "hi",
                temperature=0.5,
                top_p=0.9,
                top_k=7,
                metadata={"user_id": "u-1"},
            ),
        )
    assert resp.status_code == 200
    assert "x-service-ignored-params" not in resp.headers
    sampling = gateway.engines[CHAT].seen[-1][1]
    assert (sampling.temperature, sampling.top_p, sampling.extra["top_k"]) == (0.5, 0.9, 7)


async def test_unhonoured_fields_and_betas_are_named(gateway: GatewayHarness) -> None:
    body = request(CHAT, "hi", service_tier="auto", metadata={"user_id": "u", "x": 1})
    body["messages"][0]["content"] = [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
    ]
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(
            "/v1/messages",
            json=body,
            headers={"anthropic-beta": "made-up-2099-01-01, prompt-caching-2024-07-31"},
        )
    assert resp.status_code == 200
    assert resp.headers["x-service-ignored-params"] == "cache_control, metadata.x, service_tier"
    assert resp.headers["x-service-ignored-betas"] == "made-up-2099-01-01"


async def test_system_blocks_and_images_reach_the_template(gateway: GatewayHarness) -> None:
    png = _png()
    body = {
        "model": "scripted-vision",
        "max_tokens": 4,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"},
            {"type": "text", "text": "You are terse."},
            {"type": "text", "text": "Answer in English."},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": png},
                    },
                    {"type": "text", "text": "what is it"},
                ],
            }
        ],
    }
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/messages", json=body)
    assert resp.status_code == 200, resp.text
    prompt = gateway.engines["scripted-vision"].seen[-1][0]
    assert prompt is not None and prompt.messages is not None
    system, asked = prompt.messages
    assert system == {"role": "system", "content": "You are terse.\n\nAnswer in English."}
    assert asked["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert asked["content"][1] == {"type": "text", "text": "what is it"}


async def test_image_urls_go_through_the_ssrf_guard(gateway: GatewayHarness) -> None:
    body = request("scripted-vision", "x")
    body["messages"][0]["content"] = [
        {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/a.png"}},
        {"type": "text", "text": "what"},
    ]
    client = sdk(gateway, gateway.keys["user"])
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.messages.create(**body)
    assert "private" in refused.value.message
    assert gateway.engines["scripted-vision"].seen == []


async def test_thinking_needs_a_reasoning_channel(gateway: GatewayHarness) -> None:
    client = sdk(gateway, gateway.keys["user"])
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.messages.create(
            model=CHAT, max_tokens=2000, thinking=thinking, messages=[user("hi")]
        )
    assert "reasoning channel" in refused.value.message
    gw_model = "scripted-reasoner"
    answer = await client.messages.create(
        model=gw_model, max_tokens=2000, thinking=thinking, messages=[user("hi")]
    )
    assert [b.type for b in answer.content] == ["thinking", "text"]
    assert answer.content[0].thinking == "let me think "  # type: ignore[union-attr]
    prompt = gateway.engines[gw_model].seen[-1][0]
    assert prompt is not None and prompt.chat_template_kwargs == {"enable_thinking": True}
    # Without thinking, a model that can stop deliberating is asked to (Anthropic's default).
    await client.messages.create(model=gw_model, max_tokens=30, messages=[user("hi")])
    prompt = gateway.engines[gw_model].seen[-1][0]
    assert prompt is not None and prompt.chat_template_kwargs == {"enable_thinking": False}


async def test_tool_use_round_trip(gateway: GatewayHarness) -> None:
    client = sdk(gateway, gateway.keys["user"])
    tools: Any = [
        {
            "name": "get_weather",
            "description": "Weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    first = await client.messages.create(
        model=TOOLS,
        max_tokens=64,
        tools=tools,
        tool_choice={"type": "auto"},
        messages=[user("weather? #tool get_weather")],
    )
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input, dict)
    prompt = gateway.engines[TOOLS].seen[-1][0]
    assert prompt is not None and prompt.tool_choice == "auto"
    assert prompt.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": tools[0]["input_schema"],
                "description": "Weather of a city",
            },
        }
    ]
    second = await client.messages.create(
        model=TOOLS,
        max_tokens=64,
        tools=tools,
        messages=[
            user("weather? #tool get_weather"),
            {"role": "assistant", "content": first.content},  # type: ignore[typeddict-item]
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "sunny"},
                    {"type": "text", "text": "thanks"},
                ],
            },
        ],
    )
    assert second.stop_reason == "end_turn"
    prompt = gateway.engines[TOOLS].seen[-1][0]
    assert prompt is not None and prompt.messages is not None
    assistant, result, follow = prompt.messages[1:]
    assert assistant["tool_calls"][0]["id"] == call.id
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == call.input
    assert result == {"role": "tool", "tool_call_id": call.id, "content": "sunny"}
    assert follow["role"] == "user"


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ],
)
async def test_tool_choice_translation(
    gateway: GatewayHarness, choice: dict[str, Any], expected: Any
) -> None:
    body = request(TOOLS, "go", tool_choice=choice)
    body["tools"] = [{"name": "f", "input_schema": {"type": "object"}}]
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/messages", json=body)
    assert resp.status_code == 200, resp.text
    prompt = gateway.engines[TOOLS].seen[-1][0]
    assert prompt is not None and prompt.tool_choice == expected


async def test_server_tools_are_refused(gateway: GatewayHarness) -> None:
    body = request(TOOLS, "go", tools=[{"type": "web_search_20250305", "name": "web_search"}])
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/messages", json=body)
    assert resp.status_code == 400
    assert "server tool" in resp.json()["error"]["message"]


async def test_stream_events_in_anthropic_order(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/messages", json=request(CHAT, "one two three", stream=True))
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = named_events(resp.text)
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    text = "".join(e["delta"]["text"] for n, e in events if n == "content_block_delta")
    assert text == "one two three"
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    ((prompt, completion),) = gateway.engines[CHAT].produced.values()
    assert (final["usage"]["input_tokens"], final["usage"]["output_tokens"]) == (
        prompt,
        completion,
    )


async def test_sdk_stream_accumulates_thinking_and_text(gateway: GatewayHarness) -> None:
    client = sdk(gateway, gateway.keys["user"])
    async with client.messages.stream(
        model="scripted-tools-reasoner",
        max_tokens=2000,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[user("say this")],
    ) as stream:
        kinds = [e.type async for e in stream]
        message = await stream.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "hmm "  # type: ignore[union-attr]
    assert message.content[1].text == "say this"  # type: ignore[union-attr]
    assert "thinking" in kinds and "text" in kinds
    assert message.stop_reason == "end_turn"


async def test_sdk_stream_accumulates_tool_input(gateway: GatewayHarness) -> None:
    client = sdk(gateway, gateway.keys["user"])
    tools: Any = [{"name": "lookup", "input_schema": {"type": "object"}}]
    async with client.messages.stream(
        model=TOOLS, max_tokens=64, tools=tools, messages=[user("find #tool lookup #chunks 3")]
    ) as stream:
        kinds = [e.type async for e in stream]
        message = await stream.get_final_message()
    assert [b.type for b in message.content] == ["tool_use"]
    assert message.stop_reason == "tool_use"
    tool = message.content[0]
    assert tool.type == "tool_use" and tool.name == "lookup" and isinstance(tool.input, dict)
    assert kinds.count("input_json") >= 2  # the arguments as they were generated
    assert message.usage.output_tokens > 0


async def test_stream_with_stop_sequence_holds_back_the_stop(gateway: GatewayHarness) -> None:
    client = sdk(gateway, gateway.keys["user"])
    async with client.messages.stream(
        model=CHAT, max_tokens=16, messages=[user("a bb stop c")], stop_sequences=["stop"]
    ) as stream:
        texts = [t async for t in stream.text_stream]
        message = await stream.get_final_message()
    assert "".join(texts) == "a bb "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "stop")


async def test_broken_stream_ends_with_an_error_event_and_is_billed(
    gateway: GatewayHarness,
) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(
            "/v1/messages", json=request(CHAT, "a b c d #fail-after 2", stream=True)
        )
    events = named_events(resp.text)
    name, payload = events[-1]
    assert name == "error"
    assert payload["error"]["type"] == "api_error"
    assert "message_stop" not in [n for n, _ in events]
    (row,) = await ledger_rows(gateway)
    assert row.completion_tokens == 2 and row.route == "chat"


async def test_aborted_stream_is_billed_for_what_was_produced(gateway: GatewayHarness) -> None:
    words = " ".join(f"w{i}" for i in range(20))
    body = request(CHAT, words, stream=True)
    received = await stream_then_leave(
        gateway.app, gateway.keys["user"], body, 6, path="/v1/messages"
    )
    deltas = [c for c in received if b"text_delta" in c]
    (row,) = await ledger_rows(gateway)
    assert row.status == "aborted"
    assert 1 <= row.completion_tokens < 20
    assert row.completion_tokens >= len(deltas)


async def test_ledger_equals_the_equivalent_chat_call(gateway: GatewayHarness) -> None:
    chat_body = {"model": CHAT, "max_tokens": 8, "messages": [user("p q r s")]}
    async with gateway.client(gateway.keys["user"]) as http:
        via_chat = await http.post("/v1/chat/completions", json=chat_body)
        via_messages = await http.post("/v1/messages", json=request(CHAT, "p q r s", 8))
        streamed = await http.post("/v1/messages", json=request(CHAT, "p q r s", 8, stream=True))
    assert via_chat.status_code == via_messages.status_code == streamed.status_code == 200
    rows = await ledger_rows(gateway)
    assert len(rows) == 3
    shapes = {
        (r.model, r.route, r.status, r.prompt_tokens, r.completion_tokens, r.input_per_mtok)
        for r in rows
    }
    assert len(shapes) == 1  # same tokens, same price, same route in the ledger
    message_id = via_messages.json()["id"]
    assert "chatcmpl-" + message_id.removeprefix("msg_") in {r.request_id for r in rows}
    usage = via_messages.json()["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (
        rows[0].prompt_tokens,
        rows[0].completion_tokens,
    )


async def test_count_tokens_counts_without_generating_or_billing(
    gateway: GatewayHarness,
) -> None:
    client = sdk(gateway, gateway.keys["user"])
    body: Any = {"model": CHAT, "messages": [user("one two three")], "system": "be brief"}
    counted = await client.messages.count_tokens(**body)
    engine = gateway.engines[CHAT]
    assert engine.produced == {}  # nothing generated
    created = await client.messages.create(max_tokens=4, **body)
    assert counted.input_tokens == created.usage.input_tokens
    assert len(await ledger_rows(gateway)) == 1  # only the create
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.count_tokens(model="nope", messages=[user("x")])


async def test_messages_are_in_the_openapi_document(gateway: GatewayHarness) -> None:
    async with gateway.client() as http:
        document = (await http.get("/openapi.json")).json()
    assert "post" in document["paths"]["/v1/messages"]
    assert "post" in document["paths"]["/v1/messages/count_tokens"]
    schema = document["components"]["schemas"]["MessagesRequest"]
    assert "max_tokens" in schema["required"]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"tool_choice": {"type": "tool"}, "tools": [{"name": "f", "input_schema": {}}]}, "name"),
        ({"tool_choice": {"type": "any"}}, "needs tools"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2000}}, "budget_tokens"),
    ],
)
async def test_rules_the_schema_cannot_state_are_400(
    gateway: GatewayHarness, extra: dict[str, Any], named: str
) -> None:
    body = request("scripted-reasoner", "x", max_tokens=1500, **extra)
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/messages", json=body)
    assert resp.status_code == 400
    assert named in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "scripted-chat", "max_tokens": 4, "messages": [{"role": "user", "content": "\\ud800"}]}',  # noqa: E501
        b'{"model": "scripted-chat", "max_tokens": 4, "\\ud800": 1, "messages": [{"role": "user", "content": "x"}]}',  # noqa: E501
    ],
)
async def test_text_that_is_not_unicode_is_400_not_500(gateway: GatewayHarness, raw: bytes) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            resp = await http.post(path, content=raw, headers={"content-type": "application/json"})
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["type"] == "invalid_request_error"
            assert "nicode" in resp.json()["error"]["message"]


async def test_external_models_follow_the_catalog_rules(gateway: GatewayHarness) -> None:
    body = request("external-chat", "hi")
    async with gateway.client(gateway.keys["user"]) as http:
        refused = await http.post("/v1/messages", json=body)  # org without external providers
    async with gateway.client(gateway.keys["external"]) as http:
        unreachable = await http.post("/v1/messages", json=body)  # provider at a closed port
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "permission_error"
    assert unreachable.status_code >= 500
    assert unreachable.json()["type"] == "error"
