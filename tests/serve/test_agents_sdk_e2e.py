"""The OpenAI Agents SDK on the real tool model, as a new user runs it against `make run`.

The issue's own case: an agent told "You must call the lookup_capital tool before
answering", default model settings (``tool_choice`` left to the model, as the SDK sends
it) but temperature 0, over both SDK models. The unit test
(tests/unit/responses/test_agents_sdk.py) pins the loop with a scripted head; this one
checks that Qwen2.5-Coder-1.5B behind the head's template and parser actually takes the
loop: a call with the right argument, the SDK running the tool, an answer from its
output.
"""

from __future__ import annotations

import openai
import pytest
from agents import (
    Agent,
    Model,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.serve.conftest import CALL_TIMEOUT_S, QWEN, ServeStack

pytestmark = [pytest.mark.serve]


@pytest.fixture(autouse=True)
def _no_tracing() -> None:
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI otherwise


def _model(stack: ServeStack, kind: str) -> Model:
    client = openai.AsyncOpenAI(
        api_key=stack.key, base_url=f"{stack.base_url}/v1", max_retries=0, timeout=CALL_TIMEOUT_S
    )
    if kind == "responses":
        return OpenAIResponsesModel(model=QWEN, openai_client=client)
    return OpenAIChatCompletionsModel(model=QWEN, openai_client=client)


@pytest.mark.heads(QWEN)
@pytest.mark.parametrize("kind", ["responses", "chat"])
async def test_agent_calls_its_tool_on_the_tool_model(serve_stack: ServeStack, kind: str) -> None:
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
        model=_model(serve_stack, kind),
        model_settings=ModelSettings(temperature=0, max_tokens=48),
    )
    result = await Runner.run(agent, input="What is the capital of Japan?", max_turns=3)
    assert [country.lower() for country in asked] == ["japan"]
    assert "Tokyo" in str(result.final_output)
