"""Tool calls on the real engine: the catalog's Qwen2.5-Coder entry, as configured.

The engine is built from ``configs/catalog/local.yaml``'s own engine config (bf16,
the catalog's chat template, ``lenient_json`` loaded through ``tool_parser_plugin``), so
this checks that the plugin reaches vLLM's chat serving, that the calls the model writes
come back as OpenAI tool calls, streamed and whole, and that a tool result sent back is
answered in prose from that result. Greedy and short: one engine per module.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from deployments import registry
from deployments.chat.vllm_engine import VLLMEngine
from serve_app.contract.chat import GenerationDone, PromptSpec, SamplingSpec, TextDelta

pytest.importorskip("vllm")

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="module")]

CATALOG = Path(__file__).parents[3] / "configs/catalog/local.yaml"
MODEL_ID = "qwen2.5-coder-1.5b-instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
ASK_WEATHER = [{"role": "user", "content": "What's the weather like in Paris right now?"}]


def catalog_engine_config() -> dict[str, Any]:
    models = yaml.safe_load(CATALOG.read_text())["models"]
    (entry,) = (m for m in models if m["id"] == MODEL_ID)
    assert entry["native_tool_calling"] is True
    return dict(entry["engine"]["config"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(qwen_tool_model_dir: Path) -> AsyncIterator[VLLMEngine]:
    config = catalog_engine_config()
    assert config["model"] == f"prepared:{MODEL_ID}"
    built = registry.build_engine("chat", "vllm", config)
    assert isinstance(built, VLLMEngine)
    assert Path(built.config.model).samefile(qwen_tool_model_dir)
    await built.start()
    yield built
    await built.shutdown()


async def run(
    engine: VLLMEngine, messages: list[dict[str, Any]], stream: bool, tool_choice: Any = "auto"
) -> list[TextDelta]:
    spec = PromptSpec(kind="chat", messages=messages, tools=[WEATHER], tool_choice=tool_choice)
    sampling = SamplingSpec(max_tokens=48, temperature=0.0)
    prompt = await engine.prepare(spec, sampling)
    events = [
        e
        async for e in engine.generate(f"t-{stream}-{tool_choice}", prompt, sampling, stream=stream)
    ]
    assert isinstance(events[-1], GenerationDone)
    return [e for e in events if isinstance(e, TextDelta)]


def assembled_calls(deltas: list[TextDelta]) -> list[tuple[str, dict[str, Any]]]:
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for delta in deltas:
        for call in delta.tool_calls:
            if call.name:
                assert call.index not in names, "a call's name comes once, first"
                assert call.id
                names[call.index] = call.name
            arguments[call.index] = arguments.get(call.index, "") + call.arguments
    return [(names[i], json.loads(arguments[i])) for i in sorted(names)]


@pytest.mark.parametrize("stream", [True, False])
async def test_auto_tool_choice_returns_the_call(engine: VLLMEngine, stream: bool) -> None:
    deltas = await run(engine, ASK_WEATHER, stream)
    calls = assembled_calls(deltas)
    assert [name for name, _ in calls] == ["get_weather"]
    assert calls[0][1]["city"] == "Paris"
    assert deltas[-1].finish_reason == "tool_calls"
    assert "".join(d.text for d in deltas).strip() == ""
    if stream:  # the name first, then the arguments in pieces
        assert sum(bool(c.arguments) for d in deltas for c in d.tool_calls) >= 2


async def test_a_question_no_tool_answers_is_prose(engine: VLLMEngine) -> None:
    # Not small talk, nor a question naming a city: with get_weather offered, this model
    # answers "Hi! How are you today?" and (since the template asks for calls without prose)
    # "What is the capital of France?" with a get_weather call (docs/models.md, "Tool
    # decisions"). This one it answered in prose in every run of bench/tool_decisions.py.
    ask = [
        {"role": "user", "content": "Explain in one sentence what a Python list comprehension is."}
    ]
    deltas = await run(engine, ask, True)
    assert not assembled_calls(deltas)
    assert "list" in "".join(d.text for d in deltas).lower()


@pytest.mark.parametrize("stream", [True, False])
async def test_a_tool_result_is_answered_in_prose_from_the_result(
    engine: VLLMEngine, stream: bool
) -> None:
    arguments = json.dumps({"city": "Paris"})
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    follow_up = [
        *ASK_WEATHER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 21}'},
    ]
    deltas = await run(engine, follow_up, stream)
    assert not assembled_calls(deltas)
    text = "".join(d.text for d in deltas)
    assert "21" in text and "{" not in text, text
    assert deltas[-1].finish_reason == "stop"


async def test_named_tool_choice_is_forced(engine: VLLMEngine) -> None:
    forced = {"type": "function", "function": {"name": "get_weather"}}
    deltas = await run(
        engine, [{"role": "user", "content": "Tell me about Rome."}], False, tool_choice=forced
    )
    calls = assembled_calls(deltas)
    assert [name for name, _ in calls] == ["get_weather"]
    assert isinstance(calls[0][1].get("city"), str)
