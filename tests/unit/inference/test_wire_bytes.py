"""The chat and completions wire bytes, pinned: frames and bodies built from the protocol
types serialize exactly as the hand-built dicts did (``json.dumps`` for SSE chunks, ASCII
escaped; Starlette's ``JSONResponse`` for bodies, UTF-8).

The expected bytes (``tests/fixtures/wire/chat_completions.json``) were written by
the plain-dict code this replaced (``created`` fixed), so any change to a key's
order, presence, ``null``-ness or escaping fails here before a client sees it.
Two spellings differ and are allowed: pydantic writes a float's exponent without
padding (``-1.5e-7``, ``json.dumps``: ``-1.5e-07``) and leaves U+007F unescaped;
both parse back to the same value (last test).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serve_app.contract.chat import GenerationDone, TextDelta, ToolCallDelta
from serve_app.inference.chat import assemble
from serve_app.inference.chat.assemble import ChatChunker, Collected, CompletionChunker, json_answer

FIXTURE = Path(__file__).parents[2] / "fixtures" / "wire" / "chat_completions.json"
CHAT_LP = {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]}
LEG_LP = {"tokens": ["a"], "token_logprobs": [-0.25], "top_logprobs": [None], "text_offset": [0]}
ROUTING = {"notice": "Served by a third party.", "region": "eu"}
ANNOTATIONS = [
    {
        "type": "url_citation",
        "url_citation": {"url": "https://e.com", "title": "E", "start_index": 0, "end_index": 3},
    }
]


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assemble.time, "time", lambda: 1700000000.5)


def _chat_chunks(separate: bool) -> list[bytes]:
    chunker = ChatChunker("chatcmpl-1", "m", separate)
    frames = [chunker.role(2)]
    for delta in [
        TextDelta(0, text="Hello"),
        TextDelta(1, text='\u00e9\u4e2d\U0001f600\n"q"\\'),
        TextDelta(0, reasoning="think"),  # dropped without a separate channel: no chunk
        TextDelta(0, tool_calls=[ToolCallDelta("call_1", "get_weather", '{"city":', 0)]),
        TextDelta(0, tool_calls=[ToolCallDelta("", "", '"Paris"}', 0)]),
        TextDelta(0, finish_reason="stop", logprobs=CHAT_LP),
    ]:
        frames.append(chunker.delta(delta) or b"")
    frames.append(chunker.usage(GenerationDone(10, 5, cached_tokens=2, reasoning_tokens=3)))
    frames.append(chunker.usage(GenerationDone(10, 5)))
    frames.append(chunker.routing(ROUTING))
    frames.append(chunker.web_search({"status": "searching", "query": "q"}))
    frames.append(chunker.annotations(ANNOTATIONS))
    return frames


def _completion_chunks() -> list[bytes]:
    chunker = CompletionChunker("cmpl-1", "m", False)
    frames = [
        chunker.delta(delta) or b""
        for delta in [
            TextDelta(0, text="Hi"),
            TextDelta(1, text=" there", finish_reason="length", logprobs=LEG_LP),
            TextDelta(0),  # nothing to say: no chunk
        ]
    ]
    frames.append(chunker.usage(GenerationDone(4, 2, cached_tokens=1)))
    frames.append(chunker.routing(ROUTING))
    return frames


def _chat_collected() -> Collected:
    collected = Collected()
    for delta in [
        TextDelta(0, reasoning="hm", completion_tokens=1),
        TextDelta(0, text="H\u00e9", logprobs=CHAT_LP, completion_tokens=2),
        TextDelta(0, text="llo", logprobs=CHAT_LP, finish_reason="stop", completion_tokens=3),
        TextDelta(1, tool_calls=[ToolCallDelta("call_9", "f", '{"a":', 0)]),
        TextDelta(1, tool_calls=[ToolCallDelta("", "", "1}", 0)], finish_reason="tool_calls"),
    ]:
        collected.add(delta)
    collected.done = GenerationDone(7, 6, reasoning_tokens=1)
    return collected


def _chat_bodies(separate: bool) -> list[bytes]:
    """The plain body, then with what the tool loop and an external model add."""
    body = assemble.chat_completion_body("chatcmpl-2", "m", _chat_collected(), 3, separate)
    plain = json_answer(body, {}).content
    body.choices[0].message.annotations = ANNOTATIONS
    body.web_search = {"searches": 2, "price_per_search": 0.01}
    body.routing = ROUTING
    return [plain, json_answer(body, {}).content]


def _completion_bodies() -> list[bytes]:
    collected = Collected()
    collected.add(TextDelta(0, text="ab", logprobs=LEG_LP))
    collected.add(TextDelta(0, text="c", logprobs=LEG_LP, finish_reason="length"))
    collected.done = GenerationDone(3, 2)
    body = assemble.completion_body("cmpl-2", "m", collected, 2, False)
    plain = json_answer(body, {}).content
    body.routing = ROUTING
    return [plain, json_answer(body, {}).content]


EXPECTED: dict[str, list[bytes]] = {
    case: [frame.encode() for frame in frames]
    for case, frames in json.loads(FIXTURE.read_text(encoding="utf-8")).items()
    if not case.startswith("_")
}
BUILT = {
    "chat chunks, separate reasoning channel": lambda: _chat_chunks(True),
    "chat chunks, no reasoning channel": lambda: _chat_chunks(False),
    "completion chunks": _completion_chunks,
    "chat bodies, separate reasoning channel": lambda: _chat_bodies(True),
    "chat bodies, no reasoning channel": lambda: _chat_bodies(False),
    "completion bodies": _completion_bodies,
}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_wire_bytes_are_unchanged(case: str) -> None:
    built = BUILT[case]()
    assert set(BUILT) == set(EXPECTED)
    assert len(built) == len(EXPECTED[case])
    for n, (got, expected) in enumerate(zip(built, EXPECTED[case], strict=True)):
        assert got == expected, f"{case}, frame {n}"


def _payloads(frames: list[bytes]) -> Iterator[Any]:
    for frame in frames:
        assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
        yield json.loads(frame[6:])


def test_exponents_and_del_parse_back_to_the_same_values() -> None:
    chunker = ChatChunker("chatcmpl-1", "m", False)
    logprobs = {"content": [{"token": "\x7f", "logprob": -1.1920928955078125e-07}]}
    frame = chunker.delta(TextDelta(0, text="a\x7fb", logprobs=logprobs))
    assert frame is not None
    (chunk,) = _payloads([frame])
    assert chunk["choices"][0]["delta"]["content"] == "a\x7fb"
    assert chunk["choices"][0]["logprobs"] == logprobs
