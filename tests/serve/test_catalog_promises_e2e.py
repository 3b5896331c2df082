"""Every chat model's card lists only what a request can get from it: each listed parameter
is sent to each model on its real head, and each must be honoured (200, not named in
``x-service-ignored-params``, and where it shapes the answer, the answer shows it).

``qwen3-tiny-reasoning-demo`` once listed ``response_format``: its random reasoning never
ends, so vLLM's grammar never applied and the content came back empty.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.serve.conftest import QWEN, REASONING, SMOLLM, VISION, ServeStack

pytestmark = [pytest.mark.serve]


def _woken(model: str) -> Any:
    """One parameter, its own head woken: waking all three secondary chat heads for every
    case kept them awake together (~11 GiB of the stack's memory)."""
    return pytest.param(model, marks=pytest.mark.heads(model))


SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
# The value each listed parameter is sent with (plus what it needs to mean anything).
SENT: dict[str, dict[str, Any]] = {
    "frequency_penalty": {"frequency_penalty": 0.2},
    "presence_penalty": {"presence_penalty": 0.2},
    "max_tokens": {"max_tokens": 3},
    "max_completion_tokens": {"max_completion_tokens": 3},
    "n": {"n": 2, "temperature": 0.8},
    "seed": {"seed": 7},
    "stream": {"stream": True},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
    "temperature": {"temperature": 0.3},
    "top_p": {"top_p": 0.9},
    "stop": {"stop": ["zzzz"]},
    "logprobs": {"logprobs": True},
    "top_logprobs": {"logprobs": True, "top_logprobs": 2},
    "response_format": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
        "max_tokens": 24,
    },
    "structured_outputs": {"structured_outputs": {"json": SCHEMA}, "max_tokens": 24},
    "tools": {"tools": [TOOL]},
    "tool_choice": {"tools": [TOOL], "tool_choice": "none"},
    "parallel_tool_calls": {"tools": [TOOL], "parallel_tool_calls": True},
    "reasoning_effort": {"reasoning_effort": "low"},
}


def _check_answer(param: str, body: dict[str, Any]) -> None:
    choices = body["choices"]
    if param == "n":
        assert len(choices) == 2
    if param in ("logprobs", "top_logprobs"):
        content = choices[0]["logprobs"]["content"]
        assert content
        if param == "top_logprobs":
            assert len(content[0]["top_logprobs"]) == 2
    if param in ("response_format", "structured_outputs"):
        content = choices[0]["message"]["content"]
        assert content.lstrip().startswith("{"), content  # the grammar applied
        if choices[0]["finish_reason"] == "stop":
            assert json.loads(content) == {"city": "Paris"}


def _check_stream(param: str, text: str) -> None:
    assert text.rstrip().endswith("data: [DONE]")
    if param == "stream_options":
        chunks = [json.loads(line[6:]) for line in text.splitlines() if line[6:].startswith("{")]
        assert chunks[-1]["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("model", [SMOLLM, _woken(QWEN), _woken(VISION), _woken(REASONING)])
def test_every_listed_parameter_is_honoured(serve_stack: ServeStack, model: str) -> None:
    with serve_stack.http() as http:
        card = http.get(f"/v1/models/{model}").json()
        listed = card["supported_parameters"]
        unknown = set(listed) - set(SENT)
        assert not unknown, f"no test value for {unknown}"
        for param in listed:
            body: dict[str, Any] = {
                "model": model,
                "messages": [{"role": "user", "content": "Which city is the capital of France?"}],
            }
            if param != "max_completion_tokens":
                body["max_tokens"] = 2
            body.update(SENT[param])
            resp = http.post("/v1/chat/completions", json=body)
            assert resp.status_code == 200, (model, param, resp.text)
            ignored = resp.headers.get("x-service-ignored-params", "").split(",")
            assert param not in [name.strip() for name in ignored], (model, param, ignored)
            if body.get("stream"):
                _check_stream(param, resp.text)
            else:
                _check_answer(param, resp.json())


@pytest.mark.heads(REASONING)
def test_what_the_demo_does_not_list_is_refused(serve_stack: ServeStack) -> None:
    with serve_stack.http() as http:
        card = http.get(f"/v1/models/{REASONING}").json()
        assert "response_format" not in card["supported_parameters"]
        body = {
            "model": REASONING,
            "messages": [{"role": "user", "content": "hi"}],
            **SENT["response_format"],
        }
        resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "unsupported_parameter"
    assert resp.json()["error"]["param"] == "response_format"
