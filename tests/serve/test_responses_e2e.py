"""End to end: POST /v1/responses on Ray Serve with the real vLLM head, via the openai SDK."""

from __future__ import annotations

import pytest

from tests.serve.conftest import SMOLLM, ServeStack

pytestmark = pytest.mark.serve


def test_responses_non_stream(serve_stack: ServeStack) -> None:
    response = serve_stack.openai().responses.create(
        model=SMOLLM,
        instructions="Answer with one word.",
        input="What is the capital of France?",
        max_output_tokens=12,
        temperature=0,
        metadata={"run": "e2e"},
    )
    assert response.status in ("completed", "incomplete")
    assert "Paris" in response.output_text
    assert response.metadata == {"run": "e2e"}
    assert response.usage is not None and 0 < response.usage.output_tokens <= 12


def test_responses_stream(serve_stack: ServeStack) -> None:
    stream = serve_stack.openai().responses.create(
        model=SMOLLM, input="Say hello.", max_output_tokens=8, stream=True
    )
    kinds, numbers, text = [], [], ""
    for event in stream:
        kinds.append(event.type)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            text += event.delta
    assert kinds[0] == "response.created"
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert numbers == sorted(set(numbers))
    assert text.strip()


def test_responses_refuses_unknown_parameters(serve_stack: ServeStack) -> None:
    with serve_stack.http() as http:
        resp = http.post("/v1/responses", json={"model": SMOLLM, "input": "hi", "n": 2})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "unknown_parameter"
