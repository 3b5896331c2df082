"""Spec cases found by an independent audit of the responses route and the tool loop.

Each test states the clause it holds the gateway to (docs/reference/responses.md,
docs/reference/chat.md#chat-request).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fixtures.gateway import GatewayHarness, HarnessFactory
from tests.fixtures.open_responses import parse_sse as parse
from tests.fixtures.tool_servers import LocalWeb, script, tool_args
from tests.unit.ingress.test_limits_and_usage import ledger_records

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
BREAKS_AFTER_TWO_WORDS = script({"reply": "one two three four", "fail_after": 2})


async def post(gw: GatewayHarness, route: str, body: dict[str, Any]) -> Any:
    async with gw.client(gw.keys["tools"]) as http:
        return await http.post(route, json=body)


async def test_partial_text_then_a_break_is_incomplete_even_with_tools_declared(
    tool_gateway: GatewayHarness,
) -> None:
    """docs/reference/responses.md#statuses: "model stream broke after partial text" is incomplete,
    and the text is billed.

    Declaring a tool makes the loop hold each turn; the held text must not be lost.
    """
    body = {"model": "scripted-tools", "input": BREAKS_AFTER_TWO_WORDS, "tools": [WEATHER]}
    resp = await post(tool_gateway, "/v1/responses", body)
    assert resp.status_code == 200, resp.text
    response = resp.json()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "upstream_error"}
    assert response["output_text"] == "one two"
    assert response["usage"]["output_tokens"] == 2
    record = (await ledger_records(tool_gateway, "toolie"))[response["id"]]
    assert record.status == "partial" and record.completion_tokens == 2

    resp = await post(tool_gateway, "/v1/responses", {**body, "stream": True})
    events = parse(resp.text)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == "one two"
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "upstream_error"}


async def test_server_call_beyond_the_budget_does_not_end_as_tool_calls(
    tool_gateway: GatewayHarness, local_web: LocalWeb
) -> None:
    """A server call the loop no longer runs leaves the client nothing to execute:
    chat must not answer ``finish_reason: tool_calls`` without ``tool_calls``."""
    keeps_searching = script(
        {"reply": "Looking.", "call": "web_search", "arguments": {"query": "q"}}
    )
    tools = [{"type": "web_search", "max_uses": 1}]
    resp = await post(
        tool_gateway,
        "/v1/chat/completions",
        {
            "model": "scripted-tools",
            "messages": [{"role": "user", "content": keeps_searching}],
            "tools": tools,
        },
    )
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert not choice["message"].get("tool_calls")
    assert local_web.searches() == ["q"]

    resp = await post(
        tool_gateway,
        "/v1/responses",
        {"model": "scripted-tools", "input": keeps_searching, "tools": tools},
    )
    response = resp.json()
    assert response["status"] == "completed"
    assert [i["type"] for i in response["output"]] == ["web_search_call", "message"]


async def test_output_cap_reached_by_a_tool_turn_is_incomplete(
    tool_gateway: GatewayHarness, local_web: LocalWeb
) -> None:
    """docs/reference/responses.md#response-object: the answer was cut by max_output_tokens, so the
    response is incomplete."""
    turns = script(
        {"reply": "a b", "call": "web_search", "arguments": {"query": "q"}},
        {"reply": "never reached"},
    )
    resp = await post(
        tool_gateway,
        "/v1/responses",
        {
            "model": "scripted-tools",
            "input": turns,
            "tools": [{"type": "web_search"}],
            "max_output_tokens": 3,
        },
    )
    response = resp.json()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["output_tokens"] == 3
    assert local_web.searches() == []  # no budget left for the call's result to matter


@pytest.mark.parametrize(
    ("choice", "code"),
    [
        ({"type": "function", "name": "web_search"}, "unsupported_parameter"),
        ({"type": "function", "function": {"name": "code_interpreter"}}, "unsupported_parameter"),
        ("web_fetch", "unsupported_parameter"),
        ({"type": "web_search"}, "unsupported_parameter"),
        ("sometimes", "invalid_value"),
    ],
)
async def test_tool_choice_forcing_a_built_in_tool_in_any_spelling(
    tool_gateway: GatewayHarness, choice: Any, code: str
) -> None:
    """docs/reference/responses.md#request: tool_choice with a built-in tool gives 400
    unsupported_parameter."""
    resp = await post(
        tool_gateway,
        "/v1/responses",
        {
            "model": "scripted-tools",
            "input": "hi",
            "tools": [{"type": "web_search"}, {"type": "web_fetch"}, WEATHER],
            "tool_choice": choice,
        },
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == code
    assert resp.json()["error"]["param"] == "tool_choice"


async def test_function_parameters_must_be_an_object(tool_gateway: GatewayHarness) -> None:
    resp = await post(
        tool_gateway,
        "/v1/responses",
        {
            "model": "scripted-tools",
            "input": "hi",
            "tools": [{"type": "function", "name": "f", "parameters": "x"}],
        },
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "tools[0].parameters"


async def test_function_call_arguments_given_as_an_object_reach_the_model_as_json(
    tool_gateway: GatewayHarness,
) -> None:
    """function_call items round-trip with their call_id; the arguments are never dropped."""
    input_items = [
        {"role": "user", "content": script({"reply": "done"})},
        {"type": "function_call", "call_id": "c9", "name": "get_weather", "arguments": {"x": 1}},
        {"type": "function_call_output", "call_id": "c9", "output": "sunny"},
    ]
    resp = await post(
        tool_gateway,
        "/v1/responses",
        {"model": "scripted-tools", "input": input_items, "tools": [WEATHER]},
    )
    assert resp.status_code == 200, resp.text
    prompt, _ = tool_gateway.engines["scripted-tools"].seen[-1]
    assert prompt is not None and prompt.messages is not None
    call = prompt.messages[-2]["tool_calls"][0]
    assert call["id"] == "c9"
    assert json.loads(call["function"]["arguments"]) == {"x": 1}


async def test_chat_stream_carries_an_annotations_chunk_with_any_server_tool(
    tool_gateway: GatewayHarness,
) -> None:
    """docs/reference/chat.md#streams: a final chunk carries
    delta.annotations; code_interpreter alone has no sources, so the list is empty, but the chunk is
    there."""
    resp = await post(
        tool_gateway,
        "/v1/chat/completions",
        {
            "model": "scripted-tools",
            "messages": [{"role": "user", "content": script({"reply": "no code needed"})}],
            "tools": [{"type": "code_interpreter"}],
            "stream": True,
        },
    )
    chunks = [
        json.loads(block[len("data: ") :])
        for block in resp.text.split("\n\n")
        if block.startswith("data: {")
    ]
    annotated = [c for c in chunks if c["choices"] and "annotations" in c["choices"][0]["delta"]]
    assert len(annotated) == 1
    assert annotated[0]["choices"][0]["delta"]["annotations"] == []


async def test_chat_tool_choice_forcing_a_server_tool_is_met_once(
    tool_gateway: GatewayHarness,
) -> None:
    """Chat relays tool_choice; a forced server tool is forced on the first turn only,
    or the model could never answer (and the last turn offers no server tool at all)."""
    turns = script(
        {"call": "web_search", "arguments": {"query": "q"}},
        {"reply": "Answer [1]."},
    )
    resp = await post(
        tool_gateway,
        "/v1/chat/completions",
        {
            "model": "scripted-tools",
            "messages": [{"role": "user", "content": turns}],
            "tools": [
                {"type": "web_search"},
                {"type": "function", "function": {"name": "get_time", "parameters": {}}},
            ],
            "tool_choice": {"type": "function", "function": {"name": "web_search"}},
        },
    )
    assert resp.json()["choices"][0]["message"]["content"] == "Answer [1]."
    first, _ = tool_gateway.engines["scripted-tools"].seen[-2]
    second, _ = tool_gateway.engines["scripted-tools"].seen[-1]
    assert first is not None and second is not None
    assert first.tool_choice == {"type": "function", "function": {"name": "web_search"}}
    assert second.tool_choice == "auto"


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "2130706433", "localhost", "0x7f.1"])
async def test_the_guard_is_on_by_default_through_the_route(
    make_gateway: HarnessFactory, local_web: LocalWeb, host: str
) -> None:
    """A model asking web_fetch for the gateway's neighbours gets a failed call; the
    request still succeeds and nothing reaches the neighbour
    (docs/reference/responses.md#response-object, issue 4)."""
    args = tool_args(local_web)
    args["tools"]["web_fetch"] = {}  # the defaults: SSRF guard on
    gw = await make_gateway(args)
    gw.keys["tools"] = gw.store.create_key("guarded", "acme")
    gw.store.update_user("guarded", web_fetch=True)
    url = f"http://{host}:{local_web.port}/page/1"
    turns = script({"call": "web_fetch", "arguments": {"url": url}}, {"reply": "No luck."})
    resp = await post(
        gw,
        "/v1/responses",
        {"model": "scripted-tools", "input": turns, "tools": [{"type": "web_fetch"}]},
    )
    assert resp.status_code == 200
    fetch, message = resp.json()["output"]
    assert fetch["status"] == "failed" and fetch["action"] == {"type": "fetch", "url": url}
    assert message["content"][0]["text"] == "No luck."
    assert local_web.requests == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [{"type": ["message"], "role": "user", "content": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": ["input_text"]}]}]},
            "input[0].content[0]",
        ),
        (
            {"tools": [{"type": "web_search", "search_context_size": ["low"]}]},
            "tools[0].search_context_size",
        ),
    ],
)
async def test_any_json_value_in_a_type_field_is_a_400_not_a_500(
    tool_gateway: GatewayHarness, fields: dict[str, Any], param: str
) -> None:
    """Every refusal is the API's envelope (docs/reference/common.md), whatever JSON arrives."""
    body = {"model": "scripted-tools", "input": "hi", **fields}
    resp = await post(tool_gateway, "/v1/responses", body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
