"""Claude Code's request shapes replayed against ``/v1/messages`` (scripted heads).

The request set is ``tests/fixtures/claude_code_requests.py`` (written from Claude Code's
known request shape, not captured: the CLI cannot log in here). Each request is sent
with Claude Code's headers; the streamed answers must be Anthropic's event grammar,
and what reaches the engine must be the conversation the CLI meant.
"""

from __future__ import annotations

from typing import Any

from tests.fixtures.claude_code_requests import (
    HEADERS,
    TOOLS,
    claude_code_requests,
    main_turn,
    tool_turn,
)
from tests.fixtures.gateway import GatewayHarness
from tests.unit.messages.helpers import named_events

MODEL = "scripted-tools"


def assert_event_grammar(events: list[tuple[str, dict[str, Any]]]) -> None:
    """Anthropic's stream grammar: message_start, then blocks opened, filled and closed in
    index order (pings anywhere), then one message_delta and message_stop."""
    names = [n for n, _ in events if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    open_index: int | None = None
    next_index = 0
    for name, payload in events[1:-2]:
        if name == "content_block_start":
            assert open_index is None and payload["index"] == next_index
            open_index = next_index
        elif name == "content_block_delta":
            assert payload["index"] == open_index
        elif name == "content_block_stop":
            assert payload["index"] == open_index
            open_index, next_index = None, next_index + 1
        else:
            assert name == "ping", name
    assert open_index is None


async def _send(gateway: GatewayHarness, body: dict[str, Any]) -> Any:
    headers = {**HEADERS, "x-api-key": gateway.keys["user"]}
    async with gateway.client() as http:
        return await http.post("/v1/messages", json=body, headers=headers)


async def test_the_session_is_served_in_order(gateway: GatewayHarness) -> None:
    for body in claude_code_requests(MODEL):
        resp = await _send(gateway, body)
        assert resp.status_code == 200, resp.text
        betas = resp.headers["x-service-ignored-betas"]
        assert betas == "claude-code-20250219, interleaved-thinking-2025-05-14"
        if body.get("stream"):
            events = named_events(resp.text)
            assert_event_grammar(events)
            assert events[-2][1]["delta"]["stop_reason"] in ("end_turn", "max_tokens")
        else:
            assert resp.json()["type"] == "message"


async def test_the_main_turn_reaches_the_engine_as_meant(gateway: GatewayHarness) -> None:
    resp = await _send(gateway, main_turn(MODEL))
    ignored = resp.headers["x-service-ignored-params"].split(", ")
    # cache_control is the engine's own prefix caching; 32000 is above the model's cap.
    assert ignored == ["cache_control", "max_tokens"]
    prompt, sampling = gateway.engines[MODEL].seen[-1]
    assert prompt is not None and prompt.messages is not None
    system, asked = prompt.messages
    assert system["content"].startswith("You are Claude Code")
    assert "x-anthropic-billing-header" not in system["content"]
    assert [t["function"]["name"] for t in prompt.tools or []] == [t["name"] for t in TOOLS]
    assert prompt.tools is not None
    assert prompt.tools[3]["function"]["parameters"] == TOOLS[3]["input_schema"]
    assert asked["role"] == "user" and "<system-reminder>" in asked["content"][0]["text"]
    assert sampling.temperature == 1


async def test_a_tool_call_streams_as_claude_code_reads_it(gateway: GatewayHarness) -> None:
    body = main_turn(MODEL)
    body["messages"][0]["content"][-1]["text"] += " #tool Glob #chunks 3"
    events = named_events((await _send(gateway, body)).text)
    assert_event_grammar(events)
    starts = [e["content_block"] for n, e in events if n == "content_block_start"]
    assert starts[-1]["type"] == "tool_use" and starts[-1]["name"] == "Glob"
    assert starts[-1]["id"]
    partial = [
        e["delta"]["partial_json"]
        for n, e in events
        if n == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    ]
    assert len(partial) >= 2 and isinstance("".join(partial), str)
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_the_tool_turn_sends_the_result_back(gateway: GatewayHarness) -> None:
    resp = await _send(gateway, tool_turn(MODEL, "toolu_x"))
    assert resp.status_code == 200
    prompt = gateway.engines[MODEL].seen[-1][0]
    assert prompt is not None and prompt.messages is not None and prompt.tool_choice == "auto"
    assistant, result = prompt.messages[2:]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "Glob",
        "arguments": '{"pattern": "**/*.py"}',
    }
    assert result["role"] == "tool" and result["tool_call_id"] == "toolu_x"
    assert result["content"].endswith("test_app.py")
