"""The Response object and its stream events, built from tool-loop events (spec 2.10, 6).

One ``ResponseBuilder`` serves both modes: it keeps the Response snapshot
up to date and returns the named events each step produces; a non-streamed
request simply drops the events. Sequence numbers come from one counter, so
they strictly increase, and exactly one terminal event is produced (the
builder refuses a second). Items are appended in the order they start, and
the loop delivers them in the order of spec 2.10 (tool calls, reasoning,
function calls, message), so ``output_index`` is the final position.

Every Response snapshot (body, ``response.created`` / ``in_progress`` and the
terminal event) is a complete Open Responses ``ResponseResource``: the
settings it was generated with come from ``responses_echo``. Client function
calls arrive as OpenAI-style streaming fragments (same ``index`` = same call;
the first carries ``id`` and ``name``), and each fragment becomes one
``response.function_call_arguments.delta``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from serve_app.contract.text import GenerationDone, TextDelta, ToolCallDelta
from serve_app.inference.sse import sse_event
from serve_app.protocol.errors import GatewayError
from serve_app.tools.citations import SourceList
from serve_app.tools.runners import ToolCallRecord


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def response_usage(done: GenerationDone) -> dict[str, Any]:
    """Usage with ``input_tokens_details`` (the schema requires it; 0 when the engine
    reported no cache hit count); ``output_tokens_details`` only when the engine reported
    the reasoning split (spec 2.7, 2.10: never a made-up 0, the route's one deliberate
    deviation from Open Responses)."""
    usage: dict[str, Any] = {
        "input_tokens": done.prompt_tokens,
        "output_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "input_tokens_details": {"cached_tokens": done.cached_tokens or 0},
    }
    if done.reasoning_tokens is not None:
        usage["output_tokens_details"] = {"reasoning_tokens": done.reasoning_tokens}
    return usage


class ResponseBuilder:
    """The Response of one request and the SSE events that describe its growth."""

    def __init__(
        self,
        response_id: str,
        model: str,
        metadata: dict[str, Any] | None,
        *,
        settings: dict[str, Any],
        separate_channel: bool,
        sources: SourceList | None,
    ) -> None:
        self.response: dict[str, Any] = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "completed_at": None,
            "status": "in_progress",
            "incomplete_details": None,
            "model": model,
            "previous_response_id": None,
            "output": [],
            "output_text": "",
            "error": None,
            **settings,
            "usage": None,
            "store": False,
            "metadata": dict(metadata or {}),
        }
        self.separate_channel = separate_channel
        self.sources = sources
        self.sequence = 0
        self.terminal = False
        self._reasoning: dict[str, Any] | None = None
        self._message: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}
        """Client function calls still streaming, by the head's fragment ``index``."""
        self._text: list[str] = []
        self._thought: list[str] = []

    # -- events ---------------------------------------------------------------

    def _event(self, kind: str, **payload: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return sse_event(kind, event)

    def _snapshot(self) -> dict[str, Any]:
        output = [dict(item) for item in self.response["output"]]
        return {**self.response, "output": output}

    def _add_item(self, item: dict[str, Any]) -> tuple[int, bytes]:
        self.response["output"].append(item)
        index = len(self.response["output"]) - 1
        return index, self._event("response.output_item.added", output_index=index, item=item)

    def _index(self, item: dict[str, Any]) -> int:
        return next(i for i, o in enumerate(self.response["output"]) if o is item)

    def created(self) -> list[bytes]:
        """``response.created`` then ``response.in_progress``: generation has begun."""
        return [
            self._event("response.created", response=self._snapshot()),
            self._event("response.in_progress", response=self._snapshot()),
        ]

    # -- server tools -----------------------------------------------------------

    def tool_started(self, record: ToolCallRecord) -> list[bytes]:
        index, added = self._add_item(record.item())
        kind = f"response.{record.kind}_call.in_progress"
        return [added, self._event(kind, output_index=index, item_id=record.id)]

    def tool_finished(self, record: ToolCallRecord) -> list[bytes]:
        index = next(i for i, o in enumerate(self.response["output"]) if o["id"] == record.id)
        item = record.item()
        self.response["output"][index] = item
        frames = []
        if record.status == "completed":
            kind = f"response.{record.kind}_call.completed"
            frames.append(self._event(kind, output_index=index, item_id=record.id))
        frames.append(self._event("response.output_item.done", output_index=index, item=item))
        return frames

    # -- the answer -------------------------------------------------------------

    def delta(self, delta: TextDelta) -> list[bytes]:
        frames: list[bytes] = []
        if delta.reasoning and self.separate_channel:
            frames += self._reasoning_delta(delta.reasoning)
        if delta.tool_calls:
            frames += self._close_reasoning()
            for call in delta.tool_calls:
                frames += self._function_call(call)
        if delta.text:
            frames += self._close_reasoning()
            frames += self._close_calls()
            frames += self._text_delta(delta.text)
        return frames

    def _reasoning_delta(self, text: str) -> list[bytes]:
        frames: list[bytes] = []
        item = self._reasoning
        if item is None:
            item = {"id": _id("rs"), "type": "reasoning", "status": "in_progress"}
            item.update(summary=[], content=[])  # spec 2.10: summary stays empty
            self._reasoning = item
            index, added = self._add_item(item)
            part = {"type": "reasoning_text", "text": ""}
            frames += [added, self._part_event("added", item, index, part)]
        self._thought.append(text)
        frames.append(
            self._event(
                "response.reasoning_text.delta",
                item_id=item["id"],
                output_index=self._index(item),
                content_index=0,
                delta=text,
            )
        )
        return frames

    def _close_reasoning(self) -> list[bytes]:
        item = self._reasoning
        if item is None or item["status"] != "in_progress":
            return []
        index, text = self._index(item), "".join(self._thought)
        part = {"type": "reasoning_text", "text": text}
        item.update(status="completed", content=[part])
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            self._event("response.reasoning_text.done", **ids, text=text),
            self._part_event("done", item, index, part),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _function_call(self, call: ToolCallDelta) -> list[bytes]:
        """One fragment: a new ``index`` (or a new ``id`` on it) opens an item."""
        frames: list[bytes] = []
        item = self._calls.get(call.index)
        if item is None or (call.id and call.id != item["call_id"]):
            if item is not None:
                frames += self._close_call(call.index, "completed")
            item = {
                "id": _id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": call.id or _id("call"),
                "name": call.name,
                "arguments": "",
            }
            self._calls[call.index] = item
            frames.append(self._add_item(item)[1])
        if call.arguments:
            item["arguments"] += call.arguments
            frames.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self._index(item),
                    delta=call.arguments,
                )
            )
        return frames

    def _close_call(self, key: int, status: str) -> list[bytes]:
        item = self._calls.pop(key)
        index = self._index(item)
        item["status"] = status
        return [
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _close_calls(self, last_status: str = "completed") -> list[bytes]:
        """Close open calls in output order; ``last_status`` applies to the last item."""
        frames: list[bytes] = []
        keys = sorted(self._calls, key=lambda k: self._index(self._calls[k]))
        for n, key in enumerate(keys):
            frames += self._close_call(key, last_status if n == len(keys) - 1 else "completed")
        return frames

    def _text_delta(self, text: str) -> list[bytes]:
        frames: list[bytes] = []
        item = self._message or self._open_message(frames)
        self._text.append(text)
        frames.append(
            self._event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=self._index(item),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return frames

    def _open_message(self, frames: list[bytes]) -> dict[str, Any]:
        item: dict[str, Any] = {"id": _id("msg"), "type": "message", "status": "in_progress"}
        item.update(role="assistant", content=[])
        self._message = item
        index, added = self._add_item(item)
        part = {"type": "output_text", "text": "", "annotations": []}
        frames += [added, self._part_event("added", item, index, part)]
        return item

    def _part_event(
        self, stage: str, item: dict[str, Any], index: int, part: dict[str, Any]
    ) -> bytes:
        return self._event(
            f"response.content_part.{stage}",
            item_id=item["id"],
            output_index=index,
            content_index=0,
            part=part,
        )

    def _close_message(self, need_one: bool, status: str) -> list[bytes]:
        frames: list[bytes] = []
        item = self._message
        if item is None:
            if not need_one:
                return frames
            item = self._open_message(frames)
        if item["status"] != "in_progress":
            return frames
        index, text = self._index(item), "".join(self._text)
        annotations = self._annotations(text)
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        for n, annotation in enumerate(annotations):
            frames.append(
                self._event(
                    "response.output_text.annotation.added",
                    **ids,
                    annotation_index=n,
                    annotation=annotation,
                )
            )
        part = {"type": "output_text", "text": text, "annotations": annotations}
        item.update(status=status, content=[part])
        self.response["output_text"] = text
        frames.append(self._event("response.output_text.done", **ids, text=text, logprobs=[]))
        frames.append(self._part_event("done", item, index, part))
        frames.append(self._event("response.output_item.done", output_index=index, item=item))
        return frames

    def _annotations(self, text: str) -> list[dict[str, Any]]:
        if self.sources is None:
            return []
        return [c.for_responses() for c in self.sources.citations(text)]

    # -- the end ----------------------------------------------------------------

    def _close_all(self, need_message: bool, cut: bool) -> list[bytes]:
        """Close what is open; ``cut``: the output stopped early, so the last item (the
        message, else the last function call) is ``incomplete`` (Open Responses: an
        incomplete item is the last one of an incomplete response)."""
        status = "incomplete" if cut else "completed"
        has_calls = any(o["type"] == "function_call" for o in self.response["output"])
        frames = self._close_reasoning()
        need_one = need_message and not has_calls
        last_is_call = self._message is None and not need_one
        frames += self._close_calls(status if last_is_call else "completed")
        return frames + self._close_message(need_one, status)

    def finished(self, done: GenerationDone, finish_reason: str) -> list[bytes]:
        cut = finish_reason == "length"
        frames = self._close_all(need_message=True, cut=cut)
        self.response["usage"] = response_usage(done)
        if cut:
            return frames + self._terminal("incomplete", {"reason": "max_output_tokens"})
        return frames + self._terminal("completed")

    def failed(self, err: GatewayError, partial: GenerationDone) -> list[bytes]:
        """After the response started: partial text is incomplete, none is failed. After
        the terminal event nothing changes: the Response already stated its end."""
        if self.terminal:
            return []
        produced_text = bool("".join(self._text))
        frames = self._close_all(need_message=False, cut=produced_text)
        self.response["usage"] = response_usage(partial)
        if produced_text:
            return frames + self._terminal("incomplete", {"reason": "upstream_error"})
        self.response["error"] = {"code": err.code or "upstream_error", "message": err.message}
        return frames + self._terminal("failed")

    def _terminal(self, status: str, incomplete: dict[str, Any] | None = None) -> list[bytes]:
        if self.terminal:
            return []
        self.terminal = True
        self.response["status"] = status
        self.response["incomplete_details"] = incomplete
        self.response["completed_at"] = int(time.time())
        return [self._event(f"response.{status}", response=self._snapshot())]
