"""POST /v1/responses: the Response object, item order, round trips, incomplete
(docs/reference/responses.md)."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from tests.fixtures.gateway import GatewayHarness
from tests.fixtures.tool_servers import LocalWeb, script
from tests.unit.ingress.test_limits_and_usage import ledger_records

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


async def create(gw: GatewayHarness, key: str = "tools", **fields: Any) -> dict[str, Any]:
    async with gw.client(gw.keys[key]) as http:
        resp = await http.post("/v1/responses", json={"model": "scripted-tools", **fields})
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


async def test_plain_response_shape(gateway: GatewayHarness) -> None:
    body = await create(gateway, key="user", model="scripted-chat", input="one two three")
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] == "completed"
    assert body["error"] is None and body["incomplete_details"] is None
    assert body["store"] is False and body["previous_response_id"] is None
    assert body["metadata"] == {}
    (message,) = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["status"] == "completed" and message["id"].startswith("msg_")
    assert message["content"] == [
        {"type": "output_text", "text": "one two three", "annotations": []}
    ]
    assert body["output_text"] == "one two three"
    usage = body["usage"]
    assert usage["output_tokens"] == 3
    assert usage["total_tokens"] == usage["input_tokens"] + 3
    assert "output_tokens_details" not in usage  # the engine reported no reasoning split


async def test_reasoning_item_and_split_on_separate_channel_models(gateway: GatewayHarness) -> None:
    body = await create(gateway, key="user", model="scripted-reasoner", input="ok then")
    reasoning, message = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "let me think "}]
    assert message["content"][0]["text"] == "ok then"
    assert body["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}


async def test_item_order_tool_calls_reasoning_function_calls_message(
    tool_gateway: GatewayHarness,
) -> None:
    turns = script(
        {"reasoning": "need data", "call": "web_search", "arguments": {"query": "q"}},
        {"reasoning": "now answer", "reply": "Found [2].", "call": "get_weather"},
    )
    body = await create(
        tool_gateway,
        model="scripted-tools-reasoner",
        input=turns,
        tools=[{"type": "web_search"}, WEATHER],
    )
    assert [item["type"] for item in body["output"]] == [
        "web_search_call",
        "reasoning",
        "function_call",
        "message",
    ]
    search, reasoning, call, message = body["output"]
    assert search["status"] == "completed"
    assert search["action"] == {"type": "search", "query": "q"}
    assert reasoning["content"][0]["text"] == "need data now answer "
    assert call["name"] == "get_weather" and call["call_id"] and call["status"] == "completed"
    assert message["content"][0]["annotations"][0]["index"] == 2
    assert body["output_text"] == "Found [2]."
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == 4


async def test_function_call_round_trip(tool_gateway: GatewayHarness) -> None:
    turns = script(
        {"call": "get_weather", "arguments": {"city": "Paris"}},
        {"reply": "It is sunny."},
    )
    first = await create(tool_gateway, input=turns, tools=[WEATHER])
    (call,) = first["output"]
    assert call["type"] == "function_call"
    assert call["arguments"] == '{"city": "Paris"}'
    assert first["output_text"] == ""
    second = await create(
        tool_gateway,
        tools=[WEATHER],
        input=[
            {"role": "user", "content": turns},
            *first["output"],
            {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
        ],
    )
    assert second["output_text"] == "It is sunny."
    prompt, _ = tool_gateway.engines["scripted-tools"].seen[-1]
    assert prompt is not None and prompt.messages is not None
    assistant, tool = prompt.messages[-2:]
    assert assistant["tool_calls"][0]["id"] == call["call_id"]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert tool == {"role": "tool", "tool_call_id": call["call_id"], "content": "sunny"}


async def test_incomplete_on_max_output_tokens(gateway: GatewayHarness) -> None:
    body = await create(
        gateway, key="user", model="scripted-chat", input="a b c d e f", max_output_tokens=3
    )
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output_text"] == "a b c"


async def test_upstream_error_after_partial_text_is_incomplete_and_billed(
    tool_gateway: GatewayHarness,
) -> None:
    body = await create(
        tool_gateway, input=script({"reply": "one two three four", "fail_after": 2})
    )
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "upstream_error"}
    assert body["output_text"] == "one two"
    record = (await ledger_records(tool_gateway, "toolie"))[body["id"]]
    assert record.status == "partial" and record.completion_tokens == 2
    assert record.route == "responses"


async def test_failure_after_start_without_text_is_failed(tool_gateway: GatewayHarness) -> None:
    turns = script({"call": "web_search", "arguments": {"query": "q"}}, {"fail_before": True})
    body = await create(tool_gateway, input=turns, tools=[{"type": "web_search"}])
    assert body["status"] == "failed"
    assert body["error"]["code"] == "upstream_error"
    assert [item["type"] for item in body["output"]] == ["web_search_call"]


async def test_failure_before_any_output_keeps_its_status(tool_gateway: GatewayHarness) -> None:
    async with tool_gateway.client(tool_gateway.keys["tools"]) as http:
        resp = await http.post(
            "/v1/responses",
            json={"model": "scripted-tools", "input": script({"fail_before": True})},
        )
    assert resp.status_code == 502 and resp.json()["error"]["code"] == "upstream_error"


async def test_tool_failure_is_a_failed_item_not_a_failed_request(
    tool_gateway: GatewayHarness, local_web: LocalWeb
) -> None:
    turns = script(
        {"call": "web_fetch", "arguments": {"url": f"{local_web.base_url}/missing"}},
        {"reply": "Could not read it."},
    )
    body = await create(tool_gateway, input=turns, tools=[{"type": "web_fetch"}])
    assert body["status"] == "completed"
    fetch, message = body["output"]
    assert fetch["type"] == "web_fetch_call" and fetch["status"] == "failed"
    assert fetch["action"] == {"type": "fetch", "url": f"{local_web.base_url}/missing"}
    assert "404" in fetch["error"]["message"]
    assert message["content"][0]["annotations"] == []


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")
async def test_code_run_killed_at_timeout_is_completed_with_output(
    tool_gateway: GatewayHarness,
) -> None:
    code = "print('started', flush=True)\nwhile True:\n    pass"
    turns = script(
        {"call": "code_interpreter", "arguments": {"code": code}},
        {"reply": "The program ran too long."},
    )
    body = await create(
        tool_gateway, input=turns, tools=[{"type": "code_interpreter", "timeout_s": 1}]
    )
    run, _ = body["output"]
    assert run["type"] == "code_interpreter_call" and run["status"] == "completed"
    assert run["action"] == {"type": "call", "arguments": {"code": code}}
    assert run["outputs"] == [{"type": "logs", "logs": "started\n"}]
    record = (await ledger_records(tool_gateway, "toolie"))[body["id"]]
    assert record.code_seconds == 5.0  # timeout_s clamped up to 5 s, billed per second
