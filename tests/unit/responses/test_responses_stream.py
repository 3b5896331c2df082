"""Responses streams: named events, sequence numbers, one terminal event
(docs/reference/responses.md)."""

from __future__ import annotations

from typing import Any

from tests.fixtures.gateway import GatewayHarness
from tests.fixtures.open_responses import parse_sse as parse
from tests.fixtures.tool_servers import script

TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


async def stream(gw: GatewayHarness, key: str = "tools", **fields: Any) -> list[dict[str, Any]]:
    async with gw.client(gw.keys[key]) as http:
        resp = await http.post(
            "/v1/responses", json={"model": "scripted-tools", "stream": True, **fields}
        )
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in resp.text
    events = parse(resp.text)
    numbers = [e["sequence_number"] for e in events]
    assert numbers == sorted(set(numbers)) and numbers[0] == 0  # strictly increasing
    assert [e["type"] for e in events if e["type"] in TERMINAL] == [events[-1]["type"]]
    assert events[0]["type"] == "response.created"
    return events


async def test_full_event_order_with_tools_reasoning_and_function_call(
    tool_gateway: GatewayHarness,
) -> None:
    turns = script(
        {"call": "web_search", "arguments": {"query": "q"}},
        {"reasoning": "think", "reply": "Answer [1].", "call": "get_time"},
    )
    events = await stream(
        tool_gateway,
        model="scripted-tools-reasoner",
        input=turns,
        tools=[{"type": "web_search"}, {"type": "function", "name": "get_time"}],
    )
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # web_search_call
        "response.web_search_call.in_progress",
        "response.web_search_call.completed",
        "response.output_item.done",
        "response.output_item.added",  # reasoning
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # function_call
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",  # message
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        *["response.output_text.annotation.added"] * 5,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == [0, 1, 2, 3]
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert [i["type"] for i in final["output"]] == [
        "web_search_call",
        "reasoning",
        "function_call",
        "message",
    ]
    assert final["output_text"] == "Answer [1]."
    annotation = next(e for e in events if e["type"] == "response.output_text.annotation.added")
    assert annotation["annotation"]["index"] == 1


async def test_reasoning_events_come_before_the_first_answer_token(
    gateway: GatewayHarness,
) -> None:
    events = await stream(gateway, key="user", model="scripted-reasoner", input="fine thanks")
    kinds = [e["type"] for e in events]
    first_text = kinds.index("response.output_text.delta")
    assert kinds.index("response.reasoning_text.delta") < first_text
    assert kinds.index("response.reasoning_text.done") < first_text
    deltas = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    assert "".join(deltas) == "let me think "
    assert events[-1]["response"]["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}


async def test_stream_incomplete_on_max_output_tokens(gateway: GatewayHarness) -> None:
    events = await stream(
        gateway, key="user", model="scripted-chat", input="a b c d", max_output_tokens=2
    )
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_stream_broken_after_text_is_incomplete(tool_gateway: GatewayHarness) -> None:
    events = await stream(tool_gateway, input=script({"reply": "w x y z", "fail_after": 3}))
    final = events[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "upstream_error"}
    assert final["response"]["output_text"] == "w x y"
    assert final["response"]["usage"]["output_tokens"] == 3  # partial text is billed


async def test_stream_broken_before_text_is_failed(tool_gateway: GatewayHarness) -> None:
    turns = script({"call": "web_search", "arguments": {"query": "q"}}, {"fail_before": True})
    events = await stream(tool_gateway, input=turns, tools=[{"type": "web_search"}])
    final = events[-1]
    assert final["type"] == "response.failed"
    assert final["response"]["error"]["code"] == "upstream_error"
    assert final["response"]["status"] == "failed"


async def test_early_error_is_a_real_status(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(
            "/v1/responses",
            json={"model": "scripted-chat", "input": "#fail-before", "stream": True},
        )
    assert resp.status_code == 502
    assert resp.json()["error"]["code"] == "upstream_error"
