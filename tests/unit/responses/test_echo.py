"""What a Response states (``responses.echo``): the applied value, in schema form."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.catalog.config import CatalogModel
from serve_app.inference.responses.echo import echo_reasoning, echo_tool_choice, echo_tools
from serve_app.protocol.responses import ResponsesRequest
from serve_app.tools.declarations import build_plan


def _model(**reasoning: bool) -> CatalogModel:
    return CatalogModel.model_validate(
        {
            "id": "m",
            "head": "chat",
            "context_length": 64,
            "max_output_tokens": 8,
            "reasoning": reasoning,
        }
    )


@pytest.mark.parametrize(
    ("sent", "has_tools", "stated"),
    [
        (None, False, "none"),
        (None, True, "auto"),
        ("required", True, "required"),
        ({"type": "function", "function": {"name": "f"}}, True, {"type": "function", "name": "f"}),
    ],
)
def test_tool_choice(sent: Any, has_tools: bool, stated: Any) -> None:
    assert echo_tool_choice(sent, has_tools) == stated


def test_reasoning_as_applied() -> None:
    plain, thinker = _model(), _model(controllable=True, separate_channel=True)
    body = ResponsesRequest(model="m", input="x")
    assert echo_reasoning(body, plain) is None
    assert echo_reasoning(body, thinker) == {"effort": None, "summary": None}
    for sent, stated in [("minimal", "low"), ("none", "none"), ("high", "high")]:
        body = ResponsesRequest(model="m", input="x", reasoning={"effort": sent})
        assert echo_reasoning(body, thinker) == {"effort": stated, "summary": None}


def test_tools_flat_then_server_tools_with_their_applied_limits() -> None:
    function = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    plan = build_plan(
        [
            (1, {"type": "web_search", "search_context_size": "high"}),
            (2, {"type": "code_interpreter", "timeout_s": 8, "max_uses": 1}),
        ]
    )
    assert echo_tools([function], plan) == [
        {
            "type": "function",
            "name": "f",
            "description": None,
            "parameters": {"type": "object"},
            "strict": None,
        },
        {"type": "web_search", "max_uses": 6, "search_context_size": "high"},
        {"type": "code_interpreter", "max_uses": 1, "timeout_s": 8.0},
    ]


def test_the_vllm_head_reports_generation_config_sampling() -> None:
    """What vLLM's serving layer applies to omitted values (``get_diff_sampling_param``)."""
    from deployments.chat.vllm_engine import _sampling_defaults

    class Config:
        def __init__(self, diff: dict[str, Any] | None) -> None:
            self.diff = diff

        def get_diff_sampling_param(self) -> dict[str, Any]:
            if self.diff is None:
                raise OSError("generation_config.json unreadable")
            return self.diff

    diff = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    assert _sampling_defaults(Config(diff)) == {"temperature": 0.7, "top_p": 0.8}
    assert _sampling_defaults(Config({"presence_penalty": 1})) == {"presence_penalty": 1.0}
    assert _sampling_defaults(Config(None)) == {}
