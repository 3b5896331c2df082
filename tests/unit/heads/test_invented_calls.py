"""A turn that opens with a call to an undeclared function is answered without tools."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from deployments.chat.base import EngineEvent, EngineInfo, PreparedPrompt, TextEngine
from deployments.chat.head import ChatHeadCore
from deployments.chat.invented_calls import declared_names, invented_call
from serve_app.contract.chat import (
    GenerationDone,
    HeadEvent,
    HeadRequest,
    PromptSpec,
    SamplingSpec,
    TextDelta,
    ToolCallDelta,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
INVENTED = '{"name": "multiply", "arguments": {"a": 17, "b": 23}}'


@pytest.mark.parametrize(
    "text",
    [
        INVENTED,
        '{"name": "multiply"',  # the first streamed content: the parser released it here
        '  ```json\n{"name": "translate", "arguments": {}}\n```',
        '<tool_call>\n{"name": "greet", "arguments": {}}\n</tool_call>',
        '<tool_response>{"function": "get_definition", "arguments": {"term": "HTTP"}}',
        '[{"name": "sort_numbers", "arguments": {"numbers": [5, 2]}}]',
    ],
)
def test_invented_call_is_recognised(text: str) -> None:
    assert invented_call(text, frozenset({"get_weather"})) is not None


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',  # declared: the parser's
        "17 times 23 is 391.",
        'Here is an example: {"name": "multiply"}',  # JSON further on is an answer
        '{"name": "Alice Smith", "age": 30}',  # a value, not a function name
        '{"city": "Paris"}',
    ],
)
def test_answers_and_declared_calls_are_not_invented(text: str) -> None:
    assert invented_call(text, frozenset({"get_weather"})) is None


def test_declared_names_reads_chat_and_flat_tools() -> None:
    tools: list[dict[str, Any]] = [
        WEATHER,
        {"type": "function", "name": "send_email"},
        {"type": "web_search"},
    ]
    assert declared_names(tools) == {"get_weather", "send_email"}


class TwoMindsEngine(TextEngine):
    """Invents a call while tools are offered (``with_tools``), answers without them."""

    def __init__(self, with_tools: list[TextDelta]) -> None:
        self.with_tools = with_tools
        self.prepared: list[PromptSpec] = []
        self.started: list[str] = []
        self.closed: list[str] = []

    async def start(self) -> EngineInfo:
        return EngineInfo(max_model_len=512)

    async def prepare(self, prompt: PromptSpec, sampling: SamplingSpec) -> PreparedPrompt:
        self.prepared.append(prompt)
        return PreparedPrompt(token_ids=[1] * (10 if prompt.tools else 4), payload=prompt)

    def generate(
        self,
        request_id: str,
        prompt: PreparedPrompt,
        sampling: SamplingSpec,
        *,
        stream: bool = True,
    ) -> AsyncIterator[EngineEvent]:
        return self._generate(request_id, prompt.payload)

    async def _generate(self, request_id: str, spec: PromptSpec) -> AsyncIterator[EngineEvent]:
        self.started.append(request_id)
        try:
            if spec.tools:
                for delta in self.with_tools:
                    yield delta
                    await asyncio.sleep(0)
                yield GenerationDone(prompt_tokens=10, completion_tokens=len(self.with_tools))
            else:
                yield TextDelta(0, text="391", completion_tokens=1)
                yield TextDelta(0, finish_reason="stop", completion_tokens=1)
                yield GenerationDone(prompt_tokens=4, completion_tokens=1)
        finally:
            self.closed.append(request_id)


def _request(tool_choice: Any = "auto", n: int = 1) -> HeadRequest:
    prompt = PromptSpec(
        kind="chat",
        messages=[{"role": "user", "content": "What is 17 times 23?"}],
        tools=[WEATHER],
        tool_choice=tool_choice,
    )
    return HeadRequest(
        request_id="r1",
        prompts=[prompt],
        sampling=SamplingSpec(max_tokens=32, n=n),
        max_tokens=32,
        max_tokens_param="max_tokens",
        max_output_tokens=64,
    )


async def _run(engine: TwoMindsEngine, request: HeadRequest, **kwargs: Any) -> list[HeadEvent]:
    core = ChatHeadCore(engine, **kwargs)
    await core.start()
    return [event async for event in core.generate(request)]


def _text(events: list[HeadEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


STREAMED_INVENTION = [
    TextDelta(0, completion_tokens=0),  # a role-only delta
    TextDelta(0, text='{"name": "multiply"', completion_tokens=5),
    TextDelta(0, text=', "arguments": {"a": 17, "b": 23}}', completion_tokens=20),
    TextDelta(0, finish_reason="stop", completion_tokens=20),
]


async def test_invented_call_is_answered_again_without_tools() -> None:
    engine = TwoMindsEngine(STREAMED_INVENTION)
    events = await _run(engine, _request())
    assert _text(events) == "391"
    assert [p.tools for p in engine.prepared] == [[WEATHER], None]
    assert engine.started == ["r1-0", "r1-0-a"]
    assert "r1-0" in engine.closed  # the abandoned generation was closed (vLLM aborts it)
    done = events[-1]
    assert isinstance(done, GenerationDone)
    assert (done.prompt_tokens, done.completion_tokens) == (4, 1)  # the answer's usage


async def test_the_retry_can_be_turned_off() -> None:
    engine = TwoMindsEngine(STREAMED_INVENTION)
    events = await _run(engine, _request(), answer_invented_calls=False)
    assert _text(events).startswith('{"name": "multiply"')
    assert engine.started == ["r1-0"]


@pytest.mark.parametrize(
    "first",
    [
        TextDelta(0, text="17 times 23 is 391.", completion_tokens=8),
        TextDelta(
            0,
            tool_calls=[ToolCallDelta(index=0, id="c1", name="get_weather", arguments="{}")],
            completion_tokens=8,
        ),
    ],
)
async def test_answers_and_declared_calls_pass_through(first: TextDelta) -> None:
    engine = TwoMindsEngine([TextDelta(0, completion_tokens=0), first])
    events = await _run(engine, _request())
    assert [e for e in events if isinstance(e, TextDelta)] == engine.with_tools
    assert engine.started == ["r1-0"]


@pytest.mark.parametrize(("tool_choice", "n"), [("required", 1), ("none", 1), ("auto", 2)])
async def test_no_retry_when_the_choice_is_not_the_models_alone(tool_choice: str, n: int) -> None:
    engine = TwoMindsEngine(STREAMED_INVENTION)
    await _run(engine, _request(tool_choice, n))
    assert engine.started == ["r1-0"]
