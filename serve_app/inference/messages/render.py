"""The chat service's answer in Anthropic's shapes (docs/reference/messages.md#answer).

A whole chat completion becomes one Message; a chat stream's chunks become
Anthropic's named events, in its order: ``message_start``, ``ping``, per content
block ``content_block_start``/``content_block_delta``.../``content_block_stop``,
then ``message_delta`` (stop reason, usage) and ``message_stop``. A chat error
frame becomes an ``error`` event, which ends the stream. The conversion follows
vLLM's ``AnthropicServingMessages`` (``messages_full_converter``,
``message_stream_converter``).
"""

from __future__ import annotations

import json
from typing import Any

from serve_app.inference.answers import dumps
from serve_app.protocol.messages import (
    MessageResponse,
    MessagesUsage,
    StopReason,
    anthropic_error_type,
)

THINKING_SIGNATURE = ""
"""Anthropic signs thinking blocks so that they can be sent back unaltered; the engine's
reasoning has no signature, and a block sent back is accepted without one."""


def message_id(chat_id: str) -> str:
    """``chatcmpl-<hex>`` -> ``msg_<hex>``: the same request, in Anthropic's id form."""
    return "msg_" + chat_id.split("-", 1)[-1]


def usage_of(usage: dict[str, Any] | None) -> MessagesUsage:
    """Chat usage in Anthropic's split: cached prompt tokens apart from the rest."""
    if not usage:
        return MessagesUsage(input_tokens=0, output_tokens=0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return MessagesUsage(
        input_tokens=max(0, int(usage.get("prompt_tokens", 0)) - cached),
        output_tokens=int(usage.get("completion_tokens", 0)),
        cache_read_input_tokens=cached,
    )


def stop_reason(finish: str | None, matched: str | None, tool_used: bool) -> StopReason:
    if finish == "length":
        return "max_tokens"
    if tool_used or finish == "tool_calls":
        return "tool_use"
    if matched is not None:
        return "stop_sequence"
    return "end_turn"


def split_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    """``text`` without the stop sequence it ends with (the engine includes it when asked,
    so that the answer can name it), and that sequence."""
    for stop in sorted(stops, key=len, reverse=True):
        if stop and text.endswith(stop):
            return text[: -len(stop)], stop
    return text, None


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as ``tool_use.input`` (an object); anything else is kept under
    ``_raw`` rather than lost."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}


def message_body(chat: dict[str, Any], stops: list[str]) -> MessageResponse:
    """A non-streamed chat completion as a Message."""
    choice = chat["choices"][0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": THINKING_SIGNATURE})
    finish = choice.get("finish_reason")
    text, matched = message.get("content") or "", None
    if finish == "stop" and stops:
        text, matched = split_stop(text, stops)
    if text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls") or []
    for call in calls:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "input": tool_input(function.get("arguments", "")),
            }
        )
    if not content:
        content.append({"type": "text", "text": ""})
    return MessageResponse(
        id=message_id(chat["id"]),
        model=chat["model"],
        content=content,
        stop_reason=stop_reason(finish, matched, bool(calls)),
        stop_sequence=matched,
        usage=usage_of(chat.get("usage")),
    )


def event(name: str, payload: dict[str, Any]) -> bytes:
    """One named SSE event: ``event: <name>`` and its JSON (whose ``type`` is the name)."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(payload) + b"\n\n"


PING = event("ping", {"type": "ping"})


def error_event(error: dict[str, Any]) -> bytes:
    """A chat error frame's ``error`` object as Anthropic's ``error`` event."""
    kind = str(error.get("type") or "api_error")
    code = str(error.get("code") or "")
    if kind == "api_error":
        kind = "overloaded_error" if code in ("model_unavailable", "model_warming") else kind
    elif kind not in ("invalid_request_error", "rate_limit_error"):
        kind = anthropic_error_type(500)
    message = str(error.get("message") or "The stream failed.")
    return event("error", {"type": "error", "error": {"type": kind, "message": message}})


class StreamRenderer:
    """Chat chunks in, Anthropic events out; one per streamed request.

    Text is held back by the longest stop sequence's length (when the engine includes
    the matched stop string, the last text must be cut before it is sent).
    """

    def __init__(self, model: str, stops: list[str]) -> None:
        self.model = model
        self.stops = stops
        self._hold = max((len(s) for s in stops), default=0)
        self._pending = ""
        self._index = -1
        self._block: str | None = None
        self._tool_blocks: dict[int, int] = {}
        self._finish: str | None = None
        self._tool_used = False
        self._usage: dict[str, Any] | None = None
        self.ended = False

    def start(self, chat_id: str) -> list[bytes]:
        message = MessageResponse(
            id=message_id(chat_id),
            model=self.model,
            content=[],
            usage=MessagesUsage(input_tokens=0, output_tokens=0),
        )
        return [event("message_start", {"type": "message_start", "message": message.model_dump()})]

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        if "error" in chunk:
            self.ended = True
            return [error_event(chunk["error"] or {})]
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        out: list[bytes] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                out += self._delta("thinking", {"type": "thinking_delta", "thinking": reasoning})
            if delta.get("content"):
                out += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._tool(call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return out

    def finish(self) -> list[bytes]:
        """The closing events, once the chat stream's ``[DONE]`` came."""
        self.ended = True
        text, matched = self._pending, None
        if self._finish == "stop" and self.stops:
            text, matched = split_stop(text, self.stops)
        self._pending = ""
        out = self._delta("text", {"type": "text_delta", "text": text}) if text else []
        out += self._close()
        usage = usage_of(self._usage).model_dump()
        delta = {
            "stop_reason": stop_reason(self._finish, matched, self._tool_used),
            "stop_sequence": matched,
        }
        payload = {"type": "message_delta", "delta": delta, "usage": usage}
        out.append(event("message_delta", payload))
        out.append(event("message_stop", {"type": "message_stop"}))
        return out

    def _text(self, text: str) -> list[bytes]:
        if not self._hold:
            return self._delta("text", {"type": "text_delta", "text": text})
        self._pending += text
        ready, self._pending = self._pending[: -self._hold], self._pending[-self._hold :]
        return self._delta("text", {"type": "text_delta", "text": ready}) if ready else []

    def _tool(self, call: dict[str, Any]) -> list[bytes]:
        function = call.get("function") or {}
        out: list[bytes] = []
        index = int(call.get("index", 0))
        if call.get("id") or function.get("name") or index not in self._tool_blocks:
            out += self._flush_text()
            out += self._open(
                "tool_use",
                {
                    "type": "tool_use",
                    "id": call.get("id") or "",
                    "name": function.get("name") or "",
                    "input": {},
                },
            )
            self._tool_blocks[index] = self._index
            self._tool_used = True
        arguments = function.get("arguments")
        if arguments and self._tool_blocks.get(index) == self._index:
            delta = {"type": "input_json_delta", "partial_json": arguments}
            out.append(self._delta_event(delta))
        return out

    def _flush_text(self) -> list[bytes]:
        text, self._pending = self._pending, ""
        return self._delta("text", {"type": "text_delta", "text": text}) if text else []

    def _delta(self, kind: str, delta: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if self._block != kind:
            if kind != "text":
                out += self._flush_text()
            empty = {"type": "thinking", "thinking": "", "signature": THINKING_SIGNATURE}
            out += self._open(kind, empty if kind == "thinking" else {"type": "text", "text": ""})
        out.append(self._delta_event(delta))
        return out

    def _delta_event(self, delta: dict[str, Any]) -> bytes:
        payload = {"type": "content_block_delta", "index": self._index, "delta": delta}
        return event("content_block_delta", payload)

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self._index += 1
        self._block = kind
        payload = {"type": "content_block_start", "index": self._index, "content_block": block}
        out.append(event("content_block_start", payload))
        return out

    def _close(self) -> list[bytes]:
        if self._block is None:
            return []
        self._block = None
        return [event("content_block_stop", {"type": "content_block_stop", "index": self._index})]
