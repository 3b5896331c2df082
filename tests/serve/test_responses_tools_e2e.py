"""Client function calls on /v1/responses with the real Qwen head: streamed, and round trips.

Non-streamed ``function_call`` items are in test_tools_images_e2e.py; here the same call
arrives as stream events (``output_item.added``, argument deltas, ``done``) whose pieces
must agree with the final response, and a ``function_call`` / ``function_call_output``
pair sent back as input reaches the model (its prompt grows by what was sent), which
answers from that output in prose.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.serve.conftest import QWEN, ServeStack
from tests.serve.test_tools_images_e2e import WEATHER

pytestmark = [pytest.mark.serve, pytest.mark.heads(QWEN)]

TOOL = {"type": "function", **WEATHER["function"]}
QUESTION = "What is the weather in Paris right now?"


def test_streamed_function_call_events_agree_with_the_response(serve_stack: ServeStack) -> None:
    stream = serve_stack.openai().responses.create(
        model=QWEN,
        input=QUESTION,
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=40,
        stream=True,
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    added = [e.item for e in events if e.type == "response.output_item.added"]
    calls = [item for item in added if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == deltas and json.loads(deltas)["city"]
    final = events[-1].response  # type: ignore[union-attr]
    items = [item for item in final.output if item.type == "function_call"]
    assert [(i.name, i.arguments, i.call_id) for i in items] == [
        ("get_weather", deltas, calls[0].call_id)  # type: ignore[union-attr]
    ]
    assert final.usage is not None and 0 < final.usage.output_tokens <= 40


def test_function_call_output_round_trip(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    result = json.dumps({"city": "Paris", "temperature_c": 21, "sky": "clear"})

    def create(items: list[dict[str, Any]]) -> Any:
        return client.responses.create(
            model=QWEN,
            input=[{"role": "user", "content": QUESTION}, *items],  # type: ignore[list-item]
            tools=[TOOL],  # type: ignore[list-item]
            max_output_tokens=40,
            temperature=0,
        )

    asked = create([])
    answered = create(
        [
            {
                "type": "function_call",
                "call_id": "call_weather_1",
                "name": "get_weather",
                "arguments": json.dumps({"city": "Paris"}),
            },
            {"type": "function_call_output", "call_id": "call_weather_1", "output": result},
        ]
    )
    # The model answers from the output, in prose: one message, no second function_call.
    assert answered.status == "completed", answered.incomplete_details
    assert [o.type for o in answered.output] == ["message"]
    assert "21" in answered.output_text and "{" not in answered.output_text, answered.output_text
    assert asked.usage is not None and answered.usage is not None
    # The call and its output were rendered into the prompt (the output alone is ~20 tokens).
    assert answered.usage.input_tokens >= asked.usage.input_tokens + 20
