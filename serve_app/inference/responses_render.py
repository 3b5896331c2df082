"""The Response object and its stream events, built from tool-loop events (spec 2.10, 6).

One ``ResponseBuilder`` serves both modes: it keeps the Response snapshot
up to date and returns the named events each step produces; a non-streamed
request simply drops the events. Sequence numbers come from one counter, so
they strictly increase, and exactly one terminal event is produced (the
builder refuses a second). Items are appended in the order they start, and
the loop delivers them in the order of spec 2.10 (tool calls, reasoning,
function calls, message), so ``output_index`` is the final position.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from deployments.engines.base import GenerationDone, TextDelta, ToolCallDelta
from serve_app.ingress.streaming import sse_event
from serve_app.protocol.errors import GatewayError
from serve_app.tools.citations import SourceList
from serve_app.tools.runners import ToolCallRecord


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def response_usage(done: GenerationDone) -> dict[str, Any]:
    """Usage; the detail objects only when the engine reported them (spec 2.10)."""
    usage: dict[str, Any] = {
        "input_tokens": done.prompt_tokens,
        "output_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }
    if done.cached_tokens is not None:
        usage["input_tokens_details"] = {"cached_tokens": done.cached_tokens}
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
        separate_channel: bool,
        sources: SourceList | None,
    ) -> None:
        self.response: dict[str, Any] = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "model": model,
            "output": [],
            "output_text": "",
            "error": None,
            "incomplete_details": None,
            "previous_response_id": None,
            "store": False,
            "metadata": dict(metadata or {}),
            "usage": None,
        }
        self.separate_channel = separate_channel
        self.sources = sources
        self.sequence = 0
        self.terminal = False
        self._reasoning: dict[str, Any] | None = None
        self._message: dict[str, Any] | None = None
        self._text: list[str] = []
        self._thought: list[str] = []

    # -- events ---------------------------------------------------------------

    def _event(self, kind: str, **payload: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return sse_event(kind, event)

    def _snapshot(self) -> dict[str, Any]:
        return {**self.response, "output": list(self.response["output"])}

    def _add_item(self, item: dict[str, Any]) -> tuple[int, bytes]:
        self.response["output"].append(item)
        index = len(self.response["output"]) - 1
        return index, self._event("response.output_item.added", output_index=index, item=item)

    def _index(self, item: dict[str, Any]) -> int:
        return next(i for i, o in enumerate(self.response["output"]) if o is item)

    def created(self) -> list[bytes]:
        return [self._event("response.created", response=self._snapshot())]

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
        item = {
            "id": _id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments,
        }
        index, added = self._add_item(item)
        item = {**item, "status": "completed"}
        self.response["output"][index] = item
        return [added, self._event("response.output_item.done", output_index=index, item=item)]

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

    def _close_message(self, need_one: bool) -> list[bytes]:
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
        item.update(status="completed", content=[part])
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

    def _close_all(self, need_message: bool) -> list[bytes]:
        has_calls = any(o["type"] == "function_call" for o in self.response["output"])
        return self._close_reasoning() + self._close_message(need_message and not has_calls)

    def finished(self, done: GenerationDone, finish_reason: str) -> list[bytes]:
        frames = self._close_all(need_message=True)
        self.response["usage"] = response_usage(done)
        if finish_reason == "length":
            return frames + self._terminal("incomplete", {"reason": "max_output_tokens"})
        return frames + self._terminal("completed")

    def failed(self, err: GatewayError, partial: GenerationDone) -> list[bytes]:
        """After the response started: partial text is incomplete, none is failed."""
        produced_text = bool("".join(self._text))
        frames = self._close_all(need_message=False)
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
        return [self._event(f"response.{status}", response=self._snapshot())]
