"""The reasoning channel end to end: `make run`'s Qwen3-architecture demo through Ray Serve.

`qwen3-tiny-reasoning-demo` is a tiny random-weight Qwen3 served by the real chat head on
vLLM's OpenAI serving layer with vLLM's own ``qwen3`` reasoning parser
(deployments/local_models/tiny_reasoning_model.py). Its tokens are random and never close the
think block, so with thinking on (the default) the parser puts the whole output on the
reasoning channel and counts it as reasoning tokens; with ``reasoning_effort: none``
(``enable_thinking: false`` in Qwen3's template, read by the parser too) it is all content.
Only those mechanics are asserted, never what the text says. Driven with the openai SDK;
Responses bodies and events also go through the shared Open Responses checker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai.types.responses import (
    ResponseOutputMessage,
    ResponseReasoningItem,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
)

from tests.fixtures.open_responses import Conformance, parse_sse
from tests.serve.conftest import REASONING, ServeStack

pytestmark = [pytest.mark.serve, pytest.mark.heads(REASONING)]

QUESTION = "Why is the sky blue?"
ASK: list[Any] = [{"role": "user", "content": QUESTION}]
CAP = 8
REASONING_TEXT_EVENTS = {
    "deviation:event:response.reasoning_text.delta",
    "deviation:event:response.reasoning_text.done",
}


@pytest.fixture(scope="module")
def check() -> Iterator[Conformance]:
    """At the end: the only thing outside Open Responses' core met here is the documented
    deviation of the reasoning event names (the usage split is reported: no deviation)."""
    conformance = Conformance()
    yield conformance
    assert conformance.extensions == REASONING_TEXT_EVENTS


def test_the_card_says_demo_and_separate_channel(serve_stack: ServeStack) -> None:
    with serve_stack.http() as http:
        card = http.get(f"/v1/models/{REASONING}").json()
    assert card["tier"] == "demo" and "random" in card["notice"]
    assert card["reasoning"] == {"controllable": True, "separate_channel": True}
    assert "reasoning_effort" in card["supported_parameters"]
    assert "stop" not in card["supported_parameters"]  # no stop across a reasoning channel


def test_chat_reasoning_content_and_its_tokens(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    reply = client.chat.completions.create(model=REASONING, messages=ASK, max_tokens=CAP)
    message = reply.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning_content")
    assert isinstance(reasoning, str) and reasoning  # the parser's channel, not content
    assert not message.content
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == CAP
    details = reply.usage.completion_tokens_details
    assert details is not None and details.reasoning_tokens == CAP  # counted by vLLM


def test_chat_stream_reasoning_deltas_then_usage(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    stream = client.chat.completions.create(
        model=REASONING,
        messages=ASK,
        max_tokens=CAP,
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, content, usage = [], [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            content.append(choice.delta.content or "")
    assert "".join(reasoning) and not "".join(content)
    assert usage is not None and usage.completion_tokens == CAP
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == CAP


def test_reasoning_effort_none_turns_the_output_into_content(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    reply = client.chat.completions.create(
        model=REASONING,
        messages=ASK,
        max_tokens=CAP,
        reasoning_effort="none",  # sent as is: the gateway accepts none and off
    )
    message = reply.choices[0].message
    assert message.content and not (message.model_extra or {}).get("reasoning_content")
    assert reply.usage is not None and reply.usage.completion_tokens_details is not None
    assert reply.usage.completion_tokens_details.reasoning_tokens == 0


def test_responses_reasoning_item(serve_stack: ServeStack, check: Conformance) -> None:
    ask: dict[str, Any] = {"model": REASONING, "input": QUESTION, "max_output_tokens": CAP}
    with serve_stack.http() as http:  # the body as sent, strictly checked
        raw = http.post("/v1/responses", json=ask)
    assert raw.status_code == 200, raw.text
    check.response(raw.json())
    # Cut at the cap while reasoning: the reasoning item, then the (empty) message the
    # route always closes the answer with, incomplete as the last item of an incomplete
    # response (Open Responses).
    assert [item["type"] for item in raw.json()["output"]] == ["reasoning", "message"]

    response = serve_stack.openai().responses.create(**ask)
    reasoning, message = response.output
    assert isinstance(reasoning, ResponseReasoningItem) and reasoning.content
    assert reasoning.content[0].type == "reasoning_text" and reasoning.content[0].text
    assert isinstance(message, ResponseOutputMessage) and message.status == "incomplete"
    assert response.output_text == ""
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == CAP
    assert response.usage.output_tokens_details.reasoning_tokens == CAP


def test_responses_stream_reasoning_text_events(
    serve_stack: ServeStack, check: Conformance
) -> None:
    ask: dict[str, Any] = {"model": REASONING, "input": QUESTION, "max_output_tokens": CAP}
    with serve_stack.openai().responses.stream(**ask) as stream:
        typed = list(stream)
    deltas = [e for e in typed if isinstance(e, ResponseReasoningTextDeltaEvent)]
    (done,) = [e for e in typed if isinstance(e, ResponseReasoningTextDoneEvent)]
    assert deltas and "".join(d.delta for d in deltas) == done.text
    final = typed[-1]
    assert final.type == "response.incomplete"
    reasoning = final.response.output[0]
    assert isinstance(reasoning, ResponseReasoningItem) and reasoning.content
    assert reasoning.content[0].text == done.text

    with serve_stack.http() as http:  # the same stream as raw events, strictly checked
        raw = http.post("/v1/responses", json={**ask, "stream": True})
    assert raw.status_code == 200, raw.text
    events = parse_sse(raw.text)
    check.stream(events)
    kinds = [e["type"] for e in events]
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" not in kinds
    usage = events[-1]["response"]["usage"]
    assert usage["output_tokens_details"]["reasoning_tokens"] == usage["output_tokens"] == CAP
