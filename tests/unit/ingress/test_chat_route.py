"""Chat completions through the real app with scripted heads (docs/reference/chat.md,
docs/reference/common.md#error-codes)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.fixtures.gateway import GatewayHarness


def _chat(model: str = "scripted-chat", text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def _sse_events(body: str) -> list[Any]:
    events = []
    for block in body.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def test_openai_sdk_non_stream(gateway: GatewayHarness) -> None:
    client = gateway.openai(gateway.keys["user"])
    result = await client.chat.completions.create(
        model="scripted-chat", messages=[{"role": "user", "content": "one two three"}]
    )
    assert result.object == "chat.completion"
    assert result.choices[0].message.content == "one two three"
    assert result.choices[0].finish_reason == "stop"
    assert result.usage is not None
    assert result.usage.completion_tokens == 3
    assert result.usage.total_tokens == result.usage.prompt_tokens + 3


async def test_openai_sdk_stream_with_usage(gateway: GatewayHarness) -> None:
    client = gateway.openai(gateway.keys["user"])
    stream = await client.chat.completions.create(
        model="scripted-chat",
        messages=[{"role": "user", "content": "alpha beta"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text == "alpha beta"
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == 2


async def test_sse_framing_ends_with_done(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(stream=True))
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(resp.text)
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("usage" not in e for e in events[:-1])  # include_usage not asked


async def test_n_choices_and_usage_sum(gateway: GatewayHarness) -> None:
    client = gateway.openai(gateway.keys["user"])
    result = await client.chat.completions.create(
        model="scripted-chat", messages=[{"role": "user", "content": "a b"}], n=3
    )
    assert sorted(c.index for c in result.choices) == [0, 1, 2]
    assert result.usage is not None and result.usage.completion_tokens == 6


async def test_n_needs_temperature(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(n=2, temperature=0))
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "n"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": 33}, "max_tokens"),
        ({"max_completion_tokens": 33, "max_tokens": 5}, "max_completion_tokens"),
        ({"temperature": 2.5}, "temperature"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
async def test_parameter_limits(gateway: GatewayHarness, extra: dict[str, Any], param: str) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(**extra))
    assert resp.status_code == 400
    body = resp.json()["error"]
    assert body["param"] == param
    assert body["type"] == "invalid_request_error"


async def test_max_completion_tokens_wins(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(
            "/v1/chat/completions",
            json=_chat(text="a b c d e f", max_tokens=30, max_completion_tokens=2),
        )
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] == 2
    assert resp.json()["choices"][0]["finish_reason"] == "length"


async def test_context_length_exceeded(gateway: GatewayHarness) -> None:
    long_prompt = " ".join(f"w{i}" for i in range(50))
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(text=long_prompt, max_tokens=30))
        too_long = await http.post(
            "/v1/chat/completions", json=_chat(text=" ".join(f"x{i}" for i in range(80)))
        )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "context_length_exceeded"
    assert resp.json()["error"]["param"] == "max_tokens"
    assert too_long.status_code == 400
    assert too_long.json()["error"]["param"] == "messages"


async def test_omitted_max_tokens_uses_remaining_window(gateway: GatewayHarness) -> None:
    engine = gateway.engines["scripted-chat"]
    prompt = " ".join(f"p{i}" for i in range(40))
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(text=prompt))
    assert resp.status_code == 200
    prompt_tokens = resp.json()["usage"]["prompt_tokens"]
    assert engine.seen[-1][1].max_tokens == min(32, 64 - prompt_tokens)


async def test_unknown_role_is_400(gateway: GatewayHarness) -> None:
    body = {"model": "scripted-chat", "messages": [{"role": "wizard", "content": "hi"}]}
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "messages[0].role"


async def test_unknown_fields_relayed_and_unsupported_named(gateway: GatewayHarness) -> None:
    engine = gateway.engines["scripted-chat"]
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(top_k=5, logit_bias={"1": 2}))
    assert resp.status_code == 200
    assert engine.seen[-1][1].extra == {"top_k": 5}
    assert resp.headers["x-service-ignored-params"] == "logit_bias"


async def test_reasoning_effort_translation(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        plain = await http.post("/v1/chat/completions", json=_chat(reasoning_effort="high"))
        ctrl = await http.post(
            "/v1/chat/completions", json=_chat("scripted-reasoner", reasoning_effort="off")
        )
        harmony = await http.post(
            "/v1/chat/completions", json=_chat("scripted-harmony", reasoning_effort="minimal")
        )
        bad = await http.post("/v1/chat/completions", json=_chat(reasoning_effort="extreme"))
    assert plain.headers["x-service-ignored-params"] == "reasoning_effort"
    prompt = gateway.engines["scripted-reasoner"].seen[-1][0]
    assert prompt is not None and prompt.chat_template_kwargs == {"enable_thinking": False}
    assert ctrl.status_code == 200 and "x-service-ignored-params" not in ctrl.headers
    harmony_prompt = gateway.engines["scripted-harmony"].seen[-1][0]
    assert harmony_prompt is not None
    assert harmony_prompt.chat_template_kwargs == {"reasoning_effort": "low"}
    assert harmony.status_code == 200
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"


async def test_separate_channel_reasoning_and_stop_refused(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat("scripted-reasoner"))
        stop = await http.post("/v1/chat/completions", json=_chat("scripted-reasoner", stop="x"))
        plain = await http.post("/v1/chat/completions", json=_chat())
    message = resp.json()["choices"][0]["message"]
    assert message["reasoning_content"].split() == ["let", "me", "think"]
    assert resp.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3
    assert stop.status_code == 400 and stop.json()["error"]["code"] == "unsupported_parameter"
    assert "completion_tokens_details" not in plain.json()["usage"]
    assert "reasoning_content" not in plain.json()["choices"][0]["message"]


async def test_harmony_strict_rule(gateway: GatewayHarness) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    opted_out = {"type": "function", "function": {"name": "g", "strict": False}}
    async with gateway.client(gateway.keys["user"]) as http:
        await http.post("/v1/chat/completions", json=_chat("scripted-harmony", tools=[tool]))
        auto = gateway.engines["scripted-harmony"].seen[-1][0]
        await http.post(
            "/v1/chat/completions", json=_chat("scripted-harmony", tools=[tool, opted_out])
        )
        kept = gateway.engines["scripted-harmony"].seen[-1][0]
    assert auto is not None and auto.tools is not None
    assert auto.tools[0]["function"]["strict"] is True
    assert kept is not None and kept.tools is not None
    assert "strict" not in kept.tools[0]["function"]


async def test_tools_relayed_and_unknown_type_refused(gateway: GatewayHarness) -> None:
    tool = {"type": "function", "function": {"name": "lookup"}}
    async with gateway.client(gateway.keys["user"]) as http:
        ok = await http.post("/v1/chat/completions", json=_chat(text="#tool lookup", tools=[tool]))
        bad = await http.post("/v1/chat/completions", json=_chat(tools=[{"type": "magic"}]))
    call = ok.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "lookup"
    assert ok.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools"


async def test_error_before_output_is_real_status(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(text="#fail-before", stream=True))
    assert resp.status_code == 502
    assert resp.json()["error"]["code"] == "upstream_error"


async def test_mid_stream_failure_is_error_event(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(
            "/v1/chat/completions", json=_chat(text="a b c #fail-after 2", stream=True)
        )
    assert resp.status_code == 200
    events = _sse_events(resp.text)
    errors = [e for e in events if isinstance(e, dict) and "error" in e]
    assert errors and errors[0]["error"]["code"] == "upstream_error"
    assert events[-1] == "[DONE]"


async def test_sdk_raises_on_mid_stream_error(gateway: GatewayHarness) -> None:
    client = gateway.openai(gateway.keys["user"])
    stream = await client.chat.completions.create(
        model="scripted-chat",
        messages=[{"role": "user", "content": "x y z #fail-after 1"}],
        stream=True,
    )
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass


async def test_model_routing_errors(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        unknown = await http.post("/v1/chat/completions", json=_chat("nope"))
        speech = await http.post("/v1/chat/completions", json=_chat("tts-model"))
        external = await http.post("/v1/chat/completions", json=_chat("external-chat"))
        spot_suffix = await http.post("/v1/chat/completions", json=_chat("scripted-chat:spot"))
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert speech.status_code == 400
    assert speech.json()["error"]["code"] == "model_not_supported_for_endpoint"
    assert "/v1/audio/speech" in speech.json()["error"]["message"]
    assert external.status_code == 403
    assert external.json()["error"] == {
        "message": external.json()["error"]["message"],
        "type": "permission_error",
        "code": "external_provider_not_enabled",
        "param": "model",
    }
    assert spot_suffix.status_code == 200


async def test_upstream_timeout(gateway: GatewayHarness) -> None:
    gateway.app.state.gateway.text.timeouts = type(gateway.app.state.gateway.text.timeouts)(
        first_event_s=0.2, idle_s=0.2
    )
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(text="#stall 2 hi"))
    assert resp.status_code == 504
    assert resp.json()["error"]["code"] == "upstream_timeout"
