"""End to end on the real heads of `make run`'s catalog, through Ray Serve and the openai SDK.

Tool calls, structured outputs and logprobs run on Qwen2.5-Coder-1.5B (vLLM's serving
layer with the catalog's chat template and the `lenient_json` tool parser); images on the
SmolVLM-architecture demo model (vLLM's multimodal input; its vision tower is random, so
only the mechanics are asserted, never what it says about an image).
"""

from __future__ import annotations

import base64
import io
import json

import openai
import pytest
from PIL import Image

from tests.serve.conftest import QWEN, VISION, ServeStack

pytestmark = [pytest.mark.serve]  # heads per test: QWEN and VISION awake together cost ~8.5 GiB

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.mark.heads(QWEN)
def test_required_and_named_tool_choice_force_a_call(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        result = client.chat.completions.create(
            model=QWEN,
            messages=ASK,
            tools=[WEATHER],
            tool_choice=choice,
            max_tokens=40,  # type: ignore[arg-type]
        )
        calls = result.choices[0].message.tool_calls or []
        assert [c.function.name for c in calls] == ["get_weather"], choice
        assert "city" in json.loads(calls[0].function.arguments)
        assert result.choices[0].finish_reason in ("tool_calls", "stop")
    stream = client.chat.completions.create(
        model=QWEN,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=40,
        stream=True,
    )
    streamed = [
        call.function.name
        for chunk in stream
        for choice in chunk.choices
        for call in choice.delta.tool_calls or []
        if call.function and call.function.name
    ]
    assert streamed == ["get_weather"]


@pytest.mark.heads(QWEN)
def test_auto_tool_call_streams_as_deltas_and_round_trips(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    stream = client.chat.completions.create(
        model=QWEN, messages=ASK, tools=[WEATHER], max_tokens=40, temperature=0, stream=True
    )
    names, arguments, call_id, finish = [], "", None, None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                call_id = call.id or call_id
                if call.function and call.function.name:
                    names.append(call.function.name)
                arguments += (call.function.arguments or "") if call.function else ""
    assert names == ["get_weather"]
    assert finish == "tool_calls"
    assert json.loads(arguments)["city"]
    assert call_id
    follow_up = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": '{"temperature_c": 21}'},
    ]
    answer = client.chat.completions.create(
        model=QWEN, messages=follow_up, tools=[WEATHER], max_tokens=40, temperature=0
    )
    # The model answers from the result, in prose: no second call, no JSON written as text
    # (the 0.5B repeated its call here; docs/models.md, "Tool model").
    message = answer.choices[0].message
    assert not message.tool_calls, message.tool_calls
    assert message.content and "21" in message.content, message.content
    assert "{" not in message.content, message.content
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.prompt_tokens > 40


@pytest.mark.heads(QWEN)
def test_responses_function_call_items(serve_stack: ServeStack) -> None:
    tool = {"type": "function", **WEATHER["function"]}
    response = serve_stack.openai().responses.create(
        model=QWEN,
        input="What is the weather in Paris right now?",
        tools=[tool],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=40,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].arguments)["city"]


@pytest.mark.heads(QWEN)
def test_json_schema_and_logprobs(serve_stack: ServeStack) -> None:
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string"}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    result = serve_stack.openai().chat.completions.create(
        model=QWEN,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        logprobs=True,
        top_logprobs=2,
        max_tokens=30,
        temperature=0,
    )
    assert set(json.loads(result.choices[0].message.content or "")) == {"capital"}
    logprobs = result.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    assert all(len(t.top_logprobs) == 2 for t in logprobs.content)
    assert result.usage is not None
    assert len(logprobs.content) == result.usage.completion_tokens


def test_tools_on_a_model_without_a_parser_are_refused(serve_stack: ServeStack) -> None:
    from tests.serve.conftest import SMOLLM

    with pytest.raises(openai.BadRequestError) as caught:
        serve_stack.openai().chat.completions.create(
            model=SMOLLM,
            messages=ASK,
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=8,  # type: ignore[arg-type]
        )
    assert caught.value.body["param"] == "tools"  # type: ignore[index]


def _image(fmt: str) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (48, 32), (200, 30, 30)).save(buffer, format=fmt)
    mime = {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp"}.get(
        fmt, "tiff"
    )
    return f"data:image/{mime};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def _with_image(url: str) -> list[dict[str, object]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]


@pytest.mark.heads(VISION)
def test_images_reach_the_engine_and_are_counted(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    text_only = client.chat.completions.create(
        model=VISION,
        messages=[{"role": "user", "content": "What is in this picture?"}],
        max_tokens=4,
    )
    assert text_only.usage is not None
    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"):
        result = client.chat.completions.create(
            model=VISION,
            messages=_with_image(_image(fmt)),
            max_tokens=4,  # type: ignore[arg-type]
        )
        assert result.usage is not None
        # 4 image tokens and the markers around them (docs/models.md), counted by vLLM.
        assert result.usage.prompt_tokens > text_only.usage.prompt_tokens + 4, fmt
    stream = client.chat.completions.create(
        model=VISION,
        messages=_with_image(_image("PNG")),  # type: ignore[arg-type]
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
    assert usage is not None and usage.prompt_tokens > text_only.usage.prompt_tokens + 4


@pytest.mark.heads(VISION)
def test_responses_input_image_and_limits(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    content = [
        {"type": "input_text", "text": "Describe it."},
        {"type": "input_image", "image_url": _image("PNG")},
    ]
    response = client.responses.create(
        model=VISION,
        input=[{"role": "user", "content": content}],  # type: ignore[list-item]
        max_output_tokens=4,
    )
    assert response.usage is not None and response.usage.input_tokens > 10
    events = list(
        client.responses.create(
            model=VISION,
            input=[{"role": "user", "content": content}],  # type: ignore[list-item]
            max_output_tokens=4,
            stream=True,
        )
    )
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    assert final.response.usage is not None  # type: ignore[union-attr]
    assert final.response.usage.input_tokens == response.usage.input_tokens  # type: ignore[union-attr]
    too_many = [{"type": "input_image", "image_url": _image("PNG")}] * 5
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=VISION,
            input=[{"role": "user", "content": too_many}],  # type: ignore[list-item]
            max_output_tokens=4,
        )
    assert caught.value.body["code"] == "invalid_image"  # type: ignore[index]
    assert caught.value.body["param"] == "input[0].content[4]"  # type: ignore[index]
