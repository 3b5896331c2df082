"""The OpenAI Agents SDK (``openai-agents``) runs an agent with a function tool end to end,
over both of its models, streamed and not, against the in-process gateway.

The SDK is an independent client: it sends what it sends (``include: []`` on every
Responses call, its own item shapes, ``stream_options`` on chat). The scripted head
calls the tool in its first turn and answers in its second, so the whole loop is
exercised: the SDK's request, the call, the SDK running the tool, the tool's output
sent back, the final answer.
"""

from __future__ import annotations

import json

import pytest
from agents import (
    Agent,
    Model,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.fixtures.gateway import GatewayHarness
from tests.fixtures.tool_servers import script

ANSWER = "The capital of Japan is Tokyo."
TURNS = script(
    {"call": "lookup_capital", "arguments": {"country": "Japan"}, "chunks": 2},
    {"reply": ANSWER},
)


@pytest.fixture(autouse=True)
def _no_tracing() -> None:
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI otherwise


def models(gw: GatewayHarness) -> dict[str, Model]:
    client = gw.openai(gw.keys["user"])
    return {
        "responses": OpenAIResponsesModel(model="scripted-tools", openai_client=client),
        "chat": OpenAIChatCompletionsModel(model="scripted-tools", openai_client=client),
    }


@pytest.mark.parametrize("kind", ["responses", "chat"])
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_agent_with_a_function_tool(
    gateway: GatewayHarness, kind: str, streamed: bool
) -> None:
    asked: list[str] = []

    @function_tool
    def lookup_capital(country: str) -> str:
        """The capital city of a country."""
        asked.append(country)
        return "Tokyo"

    agent = Agent(
        name="geographer",
        instructions="You must call the lookup_capital tool before answering.",
        tools=[lookup_capital],
        model=models(gateway)[kind],
    )
    if streamed:
        run = Runner.run_streamed(agent, input=TURNS)
        kinds = [event.type async for event in run.stream_events()]
        assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
        final = run.final_output
    else:
        final = (await Runner.run(agent, input=TURNS)).final_output
    assert final == ANSWER
    assert asked == ["Japan"]
    # the second turn saw the instructions, the call and the tool's output
    prompt, _ = gateway.engines["scripted-tools"].seen[-1]
    assert prompt is not None and prompt.messages is not None
    roles = [m["role"] for m in prompt.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    call = prompt.messages[2]["tool_calls"][0]["function"]
    assert call["name"] == "lookup_capital"
    assert json.loads(call["arguments"]) == {"country": "Japan"}
    assert prompt.messages[3]["content"] == "Tokyo"
