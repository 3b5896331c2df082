"""The official openai SDK's ``responses.create`` against the in-process gateway."""

from __future__ import annotations

from tests.fixtures.gateway import GatewayHarness
from tests.fixtures.tool_servers import script


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
