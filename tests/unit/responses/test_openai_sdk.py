"""The official openai SDK's ``responses.create`` against the in-process gateway."""

from __future__ import annotations

from typing import Any

from tests.fixtures.gateway import GatewayHarness
from tests.fixtures.tool_servers import LocalWeb, script


async def test_sdk_non_stream(gateway: GatewayHarness) -> None:
    client = gateway.openai(gateway.keys["user"])
    response = await client.responses.create(
        model="scripted-chat",
        input="the quick fox",
        instructions="Be terse.",
        metadata={"k": "v"},
    )
    assert response.status == "completed"
    assert response.output_text == "the quick fox"
    assert response.metadata == {"k": "v"}
    assert response.usage is not None and response.usage.output_tokens == 3


async def test_sdk_stream(gateway: GatewayHarness) -> None:
    client = gateway.openai(gateway.keys["user"])
    stream = await client.responses.create(
        model="scripted-reasoner", input="hello again", stream=True
    )
    kinds, text, final = [], "", None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            final = event.response
    assert text == "hello again"
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final is not None and final.output_text == "hello again"
    assert [item.type for item in final.output] == ["reasoning", "message"]


async def test_sdk_stream_helper_with_server_tool(tool_gateway: GatewayHarness) -> None:
    client = tool_gateway.openai(tool_gateway.keys["tools"])
    turns = script({"call": "web_search", "arguments": {"query": "q"}}, {"reply": "Done [1]."})
    async with client.responses.stream(
        model="scripted-tools",
        input=turns,
        tools=[{"type": "web_search"}],  # type: ignore[list-item]
    ) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.output_text == "Done [1]."
    assert [item.type for item in final.output] == ["web_search_call", "message"]


async def test_sdk_parses_every_item_kind_and_a_failed_tool_call(
    tool_gateway: GatewayHarness, local_web: LocalWeb
) -> None:
    client = tool_gateway.openai(tool_gateway.keys["tools"])
    turns = script(
        {"call": "web_search", "arguments": {"query": "q"}},
        {"call": "web_fetch", "arguments": {"url": f"{local_web.base_url}/missing"}},
        {"reasoning": "so", "reply": "See [1].", "call": "get_time"},
    )
    tools: Any = [
        {"type": "web_search"},
        {"type": "web_fetch"},
        {"type": "function", "name": "get_time", "parameters": {"type": "object"}},
    ]
    response = await client.responses.create(
        model="scripted-tools-reasoner", input=turns, tools=tools
    )
    assert [(i.type, i.status) for i in response.output] == [
        ("web_search_call", "completed"),
        ("web_fetch_call", "failed"),
        ("reasoning", "completed"),
        ("function_call", "completed"),
        ("message", "completed"),
    ]
    call = response.output[3]
    assert call.type == "function_call" and call.name == "get_time" and call.call_id
    message = response.output[4]
    assert message.type == "message"
    annotation = message.content[0].annotations[0]  # type: ignore[union-attr]
    assert annotation.type == "url_citation" and annotation.url.endswith("/page/1")

    stream = await client.responses.create(
        model="scripted-tools-reasoner", input=turns, tools=tools, stream=True
    )
    numbers = [event.sequence_number async for event in stream]
    assert numbers == list(range(len(numbers)))


async def test_sdk_stream_ending_incomplete_after_partial_text(
    tool_gateway: GatewayHarness,
) -> None:
    client = tool_gateway.openai(tool_gateway.keys["tools"])
    stream = await client.responses.create(
        model="scripted-tools",
        input=script({"reply": "a b c d", "fail_after": 2}),
        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        stream=True,
    )
    events = [event async for event in stream]
    final = events[-1]
    assert final.type == "response.incomplete"
    assert final.response.incomplete_details is not None
    assert final.response.incomplete_details.reason == "upstream_error"
    assert final.response.output_text == "a b"


async def test_sdk_parses_the_applied_settings(gateway: GatewayHarness) -> None:
    """Issue 19: the typed Response states what was applied, not nulls."""
    client = gateway.openai(gateway.keys["user"])
    response = await client.responses.create(
        model="scripted-chat", input="a b c d", max_output_tokens=2, temperature=0.5
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    message = response.output[0]
    assert message.type == "message" and message.status == "incomplete"
    assert response.temperature == 0.5 and response.top_p == 1.0
    assert response.max_output_tokens == 2 and response.max_tool_calls is None
    assert response.truncation == "disabled" and response.background is False
    assert response.parallel_tool_calls is True and response.tool_choice == "none"
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "text"
    assert response.completed_at is not None and response.completed_at >= response.created_at
    assert response.usage is not None and response.usage.input_tokens_details.cached_tokens == 0


async def test_sdk_streams_a_fragmented_function_call(tool_gateway: GatewayHarness) -> None:
    client = tool_gateway.openai(tool_gateway.keys["tools"])
    weather: Any = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    turns = script(
        {"calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}] * 2, "chunks": 4}
    )
    snapshots: list[str] = []
    async with client.responses.stream(
        model="scripted-tools", input=turns, tools=[weather]
    ) as stream:
        async for event in stream:
            if event.type == "response.function_call_arguments.delta":
                snapshots.append(event.snapshot)
        final = await stream.get_final_response()
    assert len(snapshots) == 8  # four fragments per call, one delta event each
    assert snapshots[3] == snapshots[7] == '{"city": "Paris"}'
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.name, c.arguments, c.status) for c in calls] == [
        ("get_weather", '{"city": "Paris"}', "completed")
    ] * 2
    assert calls[0].call_id != calls[1].call_id
    tool = final.tools[0]
    assert tool.type == "function" and tool.name == "get_weather"
    assert tool.description == "Weather of a city"
