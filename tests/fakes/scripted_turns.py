"""Multi-turn scripts for the scripted engine: drive the server-tool loop from a test.

A user message ``#script [turn, turn, ...]`` (JSON after the marker) scripts
the model's turns after that message; the turn played is the number of
assistant messages since it, so the script is stateless and works through
any gateway (in-process or on Ray Serve). A turn is an object with any of:

- ``reasoning``: text on the reasoning channel first;
- ``reply``: answer text (one delta per word);
- ``call`` (+ ``arguments``, an object or a raw string) or ``calls``
  (a list of ``{name, arguments}``): tool calls after the text;
- ``chunks``: stream each call in that many fragments, the way OpenAI-style
  streaming tool-call deltas arrive (same ``index``; only the first fragment
  carries ``id`` and ``name``); without it a call comes whole in one delta;
- ``fail_after``: raise after that many words of ``reply``; ``fail_before``.

Turns past the end repeat the last one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from deployments.chat.base import EngineEvent
from serve_app.contract.chat import (
    GenerationDone,
    PromptSpec,
    SamplingSpec,
    TextDelta,
    ToolCallDelta,
)

MARKER = "#script"


class ScriptedTurnError(RuntimeError):
    """Raised on purpose by ``fail_before`` / ``fail_after``."""


def turn_number(prompt: PromptSpec) -> int:
    """Assistant messages after the last user message."""
    count = 0
    for message in reversed(prompt.messages or []):
        if message.get("role") == "user":
            break
        if message.get("role") == "assistant":
            count += 1
    return count


def pick_turn(last_user: str, number: int) -> dict[str, Any]:
    turns = json.loads(last_user.split(MARKER, 1)[1])
    return dict(turns[min(number, len(turns) - 1)])


def _calls(turn: dict[str, Any], number: int) -> list[ToolCallDelta]:
    specs = turn.get("calls") or ([{"name": turn["call"], **turn}] if "call" in turn else [])
    calls = []
    for i, spec in enumerate(specs):
        args = spec.get("arguments", {})
        raw = args if isinstance(args, str) else json.dumps(args)
        calls.append(
            ToolCallDelta(id=f"call_t{number}_{i}", name=spec["name"], arguments=raw, index=i)
        )
    return calls


def fragments(call: ToolCallDelta, chunks: int) -> list[ToolCallDelta]:
    """``call`` cut into ``chunks`` pieces of its arguments (the first may be empty)."""
    size = -(-len(call.arguments) // chunks) if call.arguments else 0
    pieces = [call.arguments[k * size : (k + 1) * size] for k in range(chunks)] if size else [""]
    return [
        ToolCallDelta(call.id if k == 0 else "", call.name if k == 0 else "", piece, call.index)
        for k, piece in enumerate(pieces)
        if k == 0 or piece
    ]


def word_logprobs(word: str, sampling: SamplingSpec) -> dict[str, Any] | None:
    """Chat-shaped logprobs of one word when the request asked for them (vLLM's shape:
    ``{"content": [{token, logprob, bytes, top_logprobs}]}``), else None. The logprob is
    made up but fixed (-0.5), with ``top_logprobs`` alternatives."""
    if not sampling.extra.get("logprobs"):
        return None
    top = int(sampling.extra.get("top_logprobs") or 0)
    alternatives = [
        {"token": f"alt{k}", "logprob": -1.0 - k, "bytes": list(f"alt{k}".encode())}
        for k in range(top)
    ]
    entry = {
        "token": word,
        "logprob": -0.5,
        "bytes": list(word.encode()),
        "top_logprobs": alternatives,
    }
    return {"content": [entry]}


async def play_turn(
    turn: dict[str, Any], number: int, prompt_tokens: int, sampling: SamplingSpec
) -> AsyncIterator[EngineEvent]:
    if turn.get("fail_before"):
        raise ScriptedTurnError("scripted failure before output")
    produced = 0
    for word in str(turn.get("reasoning", "")).split():
        produced += 1
        yield TextDelta(0, reasoning=word + " ", completion_tokens=produced)
    reasoning_tokens = produced
    finish = "stop"
    for i, word in enumerate(str(turn.get("reply", "")).split()):
        if "fail_after" in turn and i >= int(turn["fail_after"]):
            raise ScriptedTurnError("scripted failure mid-stream")
        if produced >= sampling.max_tokens:
            finish = "length"
            break
        produced += 1
        piece = (" " if i else "") + word
        yield TextDelta(
            0, text=piece, completion_tokens=produced, logprobs=word_logprobs(piece, sampling)
        )
    calls = _calls(turn, number) if finish != "length" else []
    if calls and "chunks" in turn:
        finish = "tool_calls"
        for call in calls:
            for fragment in fragments(call, int(turn["chunks"])):
                produced += 1
                yield TextDelta(0, tool_calls=[fragment], completion_tokens=produced)
    elif calls:
        produced += len(calls)
        finish = "tool_calls"
        yield TextDelta(0, tool_calls=calls, completion_tokens=produced)
    yield TextDelta(0, finish_reason=finish, completion_tokens=produced)
    yield GenerationDone(
        prompt_tokens=prompt_tokens,
        completion_tokens=produced,
        reasoning_tokens=reasoning_tokens if "reasoning" in turn else None,
    )
