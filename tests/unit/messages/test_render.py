"""The chat answer in Anthropic's shapes, without the app: bodies, stream events, pings."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from serve_app.inference.messages.render import StreamRenderer, message_body, split_stop
from serve_app.inference.messages.service import anthropic_frames
from tests.fixtures.waiting import until
from tests.unit.messages.helpers import named_events


def _frame(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return _frame({"id": "chatcmpl-abc", "model": "m", "choices": [choice]})


USAGE = _frame(
    {
        "id": "chatcmpl-abc",
        "choices": [],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
)


async def _frames(items: list[bytes | float], closed: list[bool]) -> AsyncIterator[bytes]:
    try:
        for item in items:
            if isinstance(item, float):
                await asyncio.sleep(item)
            else:
                yield item
    finally:
        closed.append(True)


async def _render(items: list[bytes | float], stops: list[str] | None = None, ping: float = 5.0):
    closed: list[bool] = []
    renderer = StreamRenderer("m", stops or [])
    out = [f async for f in anthropic_frames(_frames(items, closed), renderer, ping)]
    assert closed == [True]  # the chat stream is always closed (metering ends there)
    return named_events(b"".join(out).decode())


async def test_blocks_switch_from_thinking_to_text_to_tools_with_usage() -> None:
    items: list[bytes | float] = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"reasoning_content": "hmm"}),
        _chunk({"content": "I will call."}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"a"'},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        _chunk({}, finish="tool_calls"),
        USAGE,
        b"data: [DONE]\n\n",
    ]
    events = await _render(items)
    names = [n for n, _ in events]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",  # 0 thinking
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # 1 text
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # 2 tool_use
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["id"] == "msg_abc"
    starts = [e["content_block"] for n, e in events if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"]
    assert starts[2] == {"type": "tool_use", "id": "call_1", "name": "f", "input": {}}
    deltas = [e["delta"] for n, e in events if n == "content_block_delta"]
    assert deltas[0] == {"type": "thinking_delta", "thinking": "hmm"}
    assert [d["partial_json"] for d in deltas[2:]] == ['{"a"', ": 1}"]
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == "tool_use"
    assert final["usage"] == {
        "input_tokens": 6,
        "output_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
    }


async def test_pings_while_the_chat_stream_is_silent() -> None:
    """The chat stream stays silent until two pings beyond the first went out: the pings
    are waited for, not expected within a fixed silence a busy machine may overrun."""
    sent: list[bytes] = []

    def pings() -> int:
        return sum(frame.count(b"event: ping\n") for frame in sent)

    async def silent_then_late() -> AsyncIterator[bytes]:
        yield _chunk({"role": "assistant", "content": ""})
        await until(lambda: pings() >= 3)
        yield _chunk({"content": "late"}, finish="stop")
        yield b"data: [DONE]\n\n"

    async for frame in anthropic_frames(silent_then_late(), StreamRenderer("m", []), 0.05):
        sent.append(frame)
    names = [n for n, _ in named_events(b"".join(sent).decode())]
    assert names[:2] == ["message_start", "ping"]
    waiting = names[2 : names.index("content_block_start")]
    assert len(waiting) >= 2 and set(waiting) == {"ping"}
    assert names[-2:] == ["message_delta", "message_stop"]


async def test_an_error_frame_becomes_the_error_event_and_ends_the_stream() -> None:
    error = {"message": "boom", "type": "api_error", "code": "model_unavailable", "param": None}
    items: list[bytes | float] = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "par"}),
        _frame({"error": error}),
        b"data: [DONE]\n\n",
    ]
    events = await _render(items)
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "boom"}},
    )
    assert "message_stop" not in [n for n, _ in events]


async def test_a_stream_that_ends_early_says_so() -> None:
    events = await _render([_chunk({"role": "assistant", "content": ""})])
    assert events[-1][0] == "error"


async def test_closing_the_anthropic_stream_closes_the_chat_stream() -> None:
    closed: list[bool] = []
    items: list[bytes | float] = [_chunk({"role": "assistant", "content": ""}), 10.0]
    frames = anthropic_frames(_frames(items, closed), StreamRenderer("m", []), 5.0)
    assert (await anext(frames)).startswith(b"event: message_start")
    reader = asyncio.ensure_future(anext(frames))  # the ping
    await reader
    waiting = asyncio.ensure_future(anext(frames))  # blocked on the silent chat stream
    await asyncio.sleep(0.05)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await frames.aclose()  # type: ignore[attr-defined]
    assert closed == [True]


async def test_stop_sequence_is_cut_from_streamed_text() -> None:
    items: list[bytes | float] = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "hello wo"}),
        _chunk({"content": "rld END"}),
        _chunk({}, finish="stop"),
        b"data: [DONE]\n\n",
    ]
    events = await _render(items, stops=["END"])
    text = "".join(e["delta"]["text"] for n, e in events if n == "content_block_delta")
    assert text == "hello world "
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_whole_body_conversion() -> None:
    chat = {
        "id": "chatcmpl-xyz",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "why",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "f", "arguments": '{"x": 2}'}},
                        {"id": "c2", "function": {"name": "g", "arguments": "not json"}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7},
    }
    body = message_body(chat, []).model_dump()
    assert body["id"] == "msg_xyz" and body["stop_reason"] == "tool_use"
    assert body["content"] == [
        {"type": "thinking", "thinking": "why", "signature": ""},
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 2}},
        {"type": "tool_use", "id": "c2", "name": "g", "input": {"_raw": "not json"}},
    ]
    assert body["usage"]["input_tokens"] == 5 and body["usage"]["cache_read_input_tokens"] == 0
    empty = {**chat, "choices": [{"message": {"content": ""}, "finish_reason": "length"}]}
    assert message_body(empty, []).model_dump()["content"] == [{"type": "text", "text": ""}]


def test_split_stop_prefers_the_longest_match() -> None:
    assert split_stop("abc END", ["D", "END"]) == ("abc ", "END")
    assert split_stop("abc", ["x"]) == ("abc", None)
