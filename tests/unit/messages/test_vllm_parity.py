"""The gateway's Messages -> chat translation against vLLM's own
(``AnthropicServingMessages.to_chat_completion_request``), on the same requests.

The gateway does not import vLLM's Anthropic layer (it would load torch into every
gateway replica, serve_app/protocol/messages.py), so this test holds the two together:
the chat messages, tools and tool choice must mean the same thing. Known, deliberate
differences are normalized away and listed here: system blocks are joined with a
blank line (vLLM: nothing, which glues sentences), a user message's text parts stay
parts (the template joins them the same way), and an assistant turn with only tool
calls says ``content: null``.
"""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.catalog.config import CatalogModel
from serve_app.inference.messages.translate import to_chat
from serve_app.protocol.messages import MessagesRequest
from tests.fixtures.claude_code_requests import claude_code_requests

vllm_serving = pytest.importorskip("vllm.entrypoints.anthropic.serving")
vllm_protocol = pytest.importorskip("vllm.entrypoints.anthropic.protocol")

MODEL = CatalogModel.model_validate(
    {"id": "m", "head": "chat", "context_length": 4096, "max_output_tokens": 4096}
)

REQUESTS: list[dict[str, Any]] = [
    {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    {
        "model": "m",
        "max_tokens": 50,
        "system": "be brief",
        "stop_sequences": ["END"],
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 5,
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "call f"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "42"},
                    {"type": "text", "text": "and now?"},
                ],
            },
        ],
    },
    {
        "model": "m",
        "max_tokens": 50,
        "tools": [{"name": "g", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "g"},
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                    {"type": "text", "text": "what?"},
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t2", "name": "g", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    }
                ],
            },
        ],
    },
]


def _normal(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        message = {k: v for k, v in message.items() if v is not None}
        content = message.get("content")
        if isinstance(content, list) and all(p.get("type") == "text" for p in content):
            message["content"] = "".join(p["text"] for p in content)
        if message["role"] == "system":
            message["content"] = message["content"].replace("\n\n", "")
        out.append(message)
    return out


def _vllm(body: dict[str, Any]) -> dict[str, Any]:
    request = vllm_protocol.AnthropicMessagesRequest.model_validate(body)
    chat = vllm_serving.AnthropicServingMessages.to_chat_completion_request(request)
    dumped: dict[str, Any] = chat.model_dump(mode="json", exclude_none=True)
    return dumped


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description"),
            "parameters": t["function"]["parameters"],
        }
        for t in tools or []
    ]


@pytest.mark.parametrize("body", REQUESTS + claude_code_requests()[:2])
def test_translation_means_what_vllms_does(body: dict[str, Any]) -> None:
    ours = to_chat(MessagesRequest.model_validate(body), MODEL).body
    theirs = _vllm(body)
    assert _normal(ours["messages"]) == _normal(theirs["messages"])
    assert _tools(ours.get("tools")) == _tools(theirs.get("tools"))
    choice = theirs.get("tool_choice")
    if ours.get("tools"):
        assert ours.get("tool_choice", "auto") == choice
    for name in ("temperature", "top_p", "top_k", "stop"):
        assert ours.get(name) == theirs.get(name), name
    assert ours.get("max_tokens") == theirs.get("max_tokens")
