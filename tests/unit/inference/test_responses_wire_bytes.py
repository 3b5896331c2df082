"""The ``/v1/responses`` wire bytes, pinned: every named stream event and the body.

The expected bytes (``tests/fixtures/wire/responses.json``) were written by the
plain-dict ``ResponseBuilder`` (``json.dumps`` per event, ASCII escaped; the body
through Starlette's ``JSONResponse``, UTF-8) before the protocol types built them,
with the clock and ``uuid4`` fixed. Each case drives one builder the way the
responses service does and records every frame it returns, then the body of the
Response it ends with, so a change to any key's order, presence, ``null``-ness or
escaping, to an event's name or to a sequence number fails here. The cases cover
server-tool items (completed, failed with logs and error), reasoning, client
function calls in fragments, a cited message, a cut answer, an upstream failure
with and without partial text, and a failure after the terminal event (refused:
no event, and the Response it ended with is unchanged).
"""

from __future__ import annotations

import json
import time
import uuid
import warnings
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from pydantic import ConfigDict, TypeAdapter

from serve_app.contract.chat import GenerationDone, TextDelta, ToolCallDelta
from serve_app.inference.responses.render import ResponseBuilder
from serve_app.protocol.errors import GatewayError, UpstreamError
from serve_app.protocol.responses import ResponseResource, StreamEvent
from serve_app.tools.citations import SourceList
from serve_app.tools.runners import ToolCallRecord

FIXTURE = Path(__file__).parents[2] / "fixtures" / "wire" / "responses.json"
ROUTING = {"notice": "Served by a third party.", "region": "eu"}
SETTINGS: dict[str, Any] = {
    "instructions": "Be terse \u00e9.",
    "tools": [
        {
            "type": "function",
            "name": "get_time",
            "description": None,
            "parameters": {"type": "object", "properties": {}},
            "strict": None,
        },
        {"type": "web_search", "max_uses": 6, "search_context_size": "medium"},
        {"type": "code_interpreter", "max_uses": 4, "timeout_s": 10.0},
    ],
    "tool_choice": "auto",
    "truncation": "disabled",
    "parallel_tool_calls": True,
    "text": {"format": {"type": "text"}},
    "temperature": 0.7,
    "top_p": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_logprobs": 0,
    "reasoning": {"effort": None, "summary": None},
    "max_output_tokens": 64,
    "max_tool_calls": 10,
    "background": False,
    "service_tier": "default",
    "safety_identifier": None,
    "prompt_cache_key": None,
}


@pytest.fixture(autouse=True)
def _deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed clock and counting ``uuid4`` (the builder's ids are its first 24 hex digits)."""
    numbers = count(1)
    monkeypatch.setattr(time, "time", lambda: 1700000000.5)
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=next(numbers) << 32))


def _builder(separate: bool, sources: SourceList | None = None) -> ResponseBuilder:
    return ResponseBuilder(
        "resp_1",
        "m",
        {"k": "v", "\u00fc": "\u4e2d\U0001f600"},
        settings=dict(SETTINGS),
        separate_channel=separate,
        sources=sources,
    )


def _run(builder: ResponseBuilder, steps: list[Callable[[], list[bytes]]]) -> list[bytes]:
    """Every frame of the stream, then the non-streamed body of the same Response."""
    frames = builder.created()
    for step in steps:
        frames += step()
    return [*frames, builder.body()]


def _tools_reasoning_calls_and_citations() -> list[bytes]:
    sources = SourceList()
    sources.add("https://a.example/x?q=1&r=\u00e9", "A \u00e9")
    sources.add("https://b.example", "")
    builder = _builder(True, sources)
    search = ToolCallRecord("ws_1", "web_search", {"type": "search", "query": "q"}, "call_s")
    code = ToolCallRecord("ci_1", "code_interpreter", {"code": "print(1)"}, "call_c")

    def finish(record: ToolCallRecord, status: Any, **extra: Any) -> list[bytes]:
        record.status = status
        for key, value in extra.items():
            setattr(record, key, value)
        return builder.tool_finished(record)

    deltas = [
        TextDelta(0, reasoning="Let me "),
        TextDelta(0, reasoning="think \u00e9\n"),
        TextDelta(0, tool_calls=[ToolCallDelta("call_a", "get_time", '{"tz":', 0)]),
        TextDelta(0, tool_calls=[ToolCallDelta("", "", '"UTC"}', 0)]),
        TextDelta(0, tool_calls=[ToolCallDelta("call_b", "get_time", "{}", 1)]),
        TextDelta(0, text='Answer [1] \u4e2d "q"\\ '),
        TextDelta(0, text="and [2], [1,2]."),
        TextDelta(0),  # nothing to say: no event
    ]
    return _run(
        builder,
        [
            lambda: builder.tool_started(search),
            lambda: finish(search, "completed"),
            lambda: builder.tool_started(code),
            lambda: finish(code, "failed", logs="Traceback\n", error="sandbox \u00e9 died"),
            *[lambda d=d: builder.delta(d) for d in deltas],
            lambda: builder.finished(GenerationDone(20, 12, 4, 3), "stop"),
            lambda: builder.failed(UpstreamError("late"), GenerationDone(20, 12)),  # refused
        ],
    )


def _cut_without_reasoning_channel() -> list[bytes]:
    builder = _builder(False)
    builder.response["routing"] = ROUTING
    deltas = [TextDelta(0, reasoning="hidden"), TextDelta(0, text="Hello"), TextDelta(0, text="!")]
    return _run(
        builder,
        [
            *[lambda d=d: builder.delta(d) for d in deltas],
            lambda: builder.finished(GenerationDone(5, 2), "length"),
        ],
    )


def _function_calls_cut() -> list[bytes]:
    """A new ``id`` on the same index opens a second call; the cut leaves it incomplete."""
    builder = _builder(True)
    deltas = [
        TextDelta(0, reasoning="plan"),
        TextDelta(0, tool_calls=[ToolCallDelta("call_a", "f", '{"a":1}', 0)]),
        TextDelta(0, tool_calls=[ToolCallDelta("call_b", "g", '{"b":', 0)]),
        TextDelta(0, tool_calls=[ToolCallDelta("", "", "2", 0)]),
    ]
    return _run(
        builder,
        [
            *[lambda d=d: builder.delta(d) for d in deltas],
            lambda: builder.finished(GenerationDone(9, 8, cached_tokens=0), "length"),
        ],
    )


def _failed_after_partial_text() -> list[bytes]:
    builder = _builder(True)
    steps: list[Callable[[], list[bytes]]] = [
        lambda: builder.delta(TextDelta(0, reasoning="r")),
        lambda: builder.delta(TextDelta(0, text="Part")),
        lambda: builder.failed(UpstreamError("boom"), GenerationDone(3, 2)),
    ]
    return _run(builder, steps)


def _failed_without_text() -> list[bytes]:
    builder = _builder(True)
    call = ToolCallDelta("", "f", "{", 0)  # no id from the head: the builder makes one
    steps: list[Callable[[], list[bytes]]] = [
        lambda: builder.delta(TextDelta(0, reasoning="r\u00e9")),
        lambda: builder.delta(TextDelta(0, tool_calls=[call])),
        lambda: builder.failed(GatewayError("engine \u00e9 gone"), GenerationDone(3, 0)),
    ]
    return _run(builder, steps)


def _empty_answer() -> list[bytes]:
    builder = _builder(False)
    return _run(
        builder,
        [
            lambda: builder.finished(GenerationDone(2, 0), "stop"),
            lambda: builder.failed(UpstreamError("late"), GenerationDone(2, 0)),  # refused
        ],
    )


EXPECTED: dict[str, list[bytes]] = {
    case: [frame.encode() for frame in frames]
    for case, frames in json.loads(FIXTURE.read_text(encoding="utf-8")).items()
    if not case.startswith("_")
}
BUILT: dict[str, Callable[[], list[bytes]]] = {
    "server tools, reasoning, function calls, citations": _tools_reasoning_calls_and_citations,
    "cut, no reasoning channel, routing": _cut_without_reasoning_channel,
    "function calls cut": _function_calls_cut,
    "failed after partial text": _failed_after_partial_text,
    "failed without text": _failed_without_text,
    "empty answer": _empty_answer,
}


@pytest.mark.parametrize("case", list(BUILT))
def test_wire_bytes_are_unchanged(case: str) -> None:
    assert set(BUILT) == set(EXPECTED)
    with warnings.catch_warnings():
        # An item or part that no member of its union fits would still be written
        # (pydantic falls back to inferring its type), but with a warning.
        warnings.simplefilter("error")
        built = BUILT[case]()
    assert len(built) == len(EXPECTED[case])
    for n, (got, expected) in enumerate(zip(built, EXPECTED[case], strict=True)):
        assert got == expected, f"{case}, frame {n}"


def _data(frame: bytes) -> Any:
    name, data = frame.split(b"\n", 1)
    assert name.startswith(b"event: ") and data.startswith(b"data: ") and data.endswith(b"\n\n")
    return json.loads(data[len(b"data: ") :])


def test_del_parses_back_to_the_same_text() -> None:
    """U+007F: ``json.dumps`` escaped it, pydantic writes it as it is (valid JSON either
    way, as on chat); the event and the body still carry the same text."""
    builder = _builder(False)
    builder.created()
    *_, frame = builder.delta(TextDelta(0, text="a\x7fb"))
    assert _data(frame)["delta"] == "a\x7fb"
    builder.finished(GenerationDone(1, 1), "stop")
    assert json.loads(builder.body())["output_text"] == "a\x7fb"


def test_the_protocol_types_describe_every_pinned_frame_exactly() -> None:
    """Strict, no extra key at any depth: each event is its type's TypedDict (picked by
    ``type``), each body a ``ResponseResource``; so the types the builder is checked
    against (and the published schema) are what the wire carries."""
    exact = ConfigDict(extra="forbid", strict=True)
    events = TypeAdapter(list[StreamEvent], config=exact)
    bodies = TypeAdapter(list[ResponseResource], config=exact)
    for frames in EXPECTED.values():
        events.validate_python([_data(frame) for frame in frames[:-1]])
        bodies.validate_json(b"[" + frames[-1] + b"]")
