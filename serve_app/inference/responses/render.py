"""The Response object and its stream events, built from tool-loop events
(docs/reference/responses.md).

One ``ResponseBuilder`` serves both modes: it keeps the Response snapshot
up to date and returns the named events each step produces; a non-streamed
request simply drops the events and takes ``body()``. Sequence numbers come
from one counter, so they strictly increase, and exactly one terminal event is
produced (the builder refuses a second, and a refused one changes nothing).
Items are appended in the order they start, and the loop delivers them in the
order of docs/reference/responses.md#response-object (tool calls, reasoning, function calls,
message), so ``output_index`` is the final position.

The Response, its items and every event are the protocol's TypedDicts
(``serve_app.protocol.responses``), each serialized once, straight to bytes, by
a ``TypeAdapter`` built once per type: an event per token is on the hot path,
and a checked dict costs less there than a model instance or ``json.dumps``.
Events are written ASCII-escaped (as ``json.dumps`` wrote them), the body as
UTF-8 (as Starlette's ``JSONResponse`` did); ``tests/unit/inference/
test_responses_wire_bytes.py`` pins the bytes.

Every Response snapshot (body, ``response.created`` / ``in_progress`` and the
terminal event) is a complete Open Responses ``ResponseResource``: the
settings it was generated with come from ``responses.echo``. Client function
calls arrive as OpenAI-style streaming fragments (same ``index`` = same call;
the first carries ``id`` and ``name``), and each fragment becomes one
``response.function_call_arguments.delta``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, TypeVar, cast

from pydantic import TypeAdapter

from serve_app.contract.chat import GenerationDone, TextDelta, ToolCallDelta
from serve_app.protocol.errors import GatewayError
from serve_app.protocol.responses import (
    AnnotationAddedEvent,
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    FunctionCallItem,
    IncompleteDetails,
    ItemStatus,
    MessageItem,
    OutputItem,
    OutputItemEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    OutputTextPart,
    ReasoningItem,
    ReasoningTextDeltaEvent,
    ReasoningTextDoneEvent,
    ReasoningTextPart,
    ResponseEvent,
    ResponseEventType,
    ResponseResource,
    ResponseSettings,
    ResponseUsage,
    ServerToolCallEvent,
    ServerToolEventType,
    TokenLogprob,
    UrlCitation,
)
from serve_app.tools.citations import SourceList
from serve_app.tools.runners import ToolCallRecord

_RESPONSE = TypeAdapter(ResponseResource)
_RESPONSE_EVENT = TypeAdapter(ResponseEvent)
_ITEM_EVENT = TypeAdapter(OutputItemEvent)
_PART_EVENT = TypeAdapter(ContentPartEvent)
_TEXT_DELTA = TypeAdapter(OutputTextDeltaEvent)
_TEXT_DONE = TypeAdapter(OutputTextDoneEvent)
_ANNOTATION = TypeAdapter(AnnotationAddedEvent)
_REASONING_DELTA = TypeAdapter(ReasoningTextDeltaEvent)
_REASONING_DONE = TypeAdapter(ReasoningTextDoneEvent)
_ARGUMENTS_DELTA = TypeAdapter(ArgumentsDeltaEvent)
_ARGUMENTS_DONE = TypeAdapter(ArgumentsDoneEvent)
_TOOL_EVENT = TypeAdapter(ServerToolCallEvent)

Event = TypeVar(
    "Event",
    ResponseEvent,
    OutputItem,
    OutputItemEvent,
    ContentPartEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    AnnotationAddedEvent,
    ReasoningTextDeltaEvent,
    ReasoningTextDoneEvent,
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ServerToolCallEvent,
)
Terminal = Literal["completed", "incomplete", "failed"]
_TERMINAL_EVENT: dict[Terminal, ResponseEventType] = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _frame(adapter: TypeAdapter[Event], event: Event) -> bytes:
    """A named SSE event: ``event:`` line (the ``type``), then the ``data:`` line."""
    payload = adapter.dump_json(event, ensure_ascii=True)
    return b"event: " + event["type"].encode() + b"\ndata: " + payload + b"\n\n"


def _token_logprobs(logprobs: Any) -> list[TokenLogprob]:
    """A delta's logprobs in the chat shape the head returns (``{"content": [...]}``,
    entries ``{token, logprob, bytes, top_logprobs}``): the same entries Responses uses."""
    if not isinstance(logprobs, dict):
        return []
    return cast(list[TokenLogprob], logprobs.get("content") or [])


def response_usage(done: GenerationDone) -> ResponseUsage:
    """Usage with ``input_tokens_details`` (the schema requires it; 0 when the engine
    reported no cache hit count); ``output_tokens_details`` only when the engine reported
    the reasoning split (docs/reference/chat.md#usage, docs/reference/responses.md#response-object:
    never a made-up 0, the route's one deliberate deviation from Open Responses)."""
    usage: ResponseUsage = {
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
        settings: ResponseSettings,
        separate_channel: bool,
        sources: SourceList | None,
        logprobs: bool = False,
    ) -> None:
        """``logprobs``: the request included ``message.output_text.logprobs``, so text
        events and the final part carry the tokens' logprobs the head returned."""
        self.response: ResponseResource = {
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
        self._reasoning: ReasoningItem | None = None
        self._message: MessageItem | None = None
        self._calls: dict[int, FunctionCallItem] = {}
        """Client function calls still streaming, by the head's fragment ``index``."""
        self._indexes: dict[str, int] = {}
        """``output_index`` by item id: items are only appended (or replaced in place)."""
        self._text: list[str] = []
        self._thought: list[str] = []
        self.logprobs = logprobs
        self._logprobs: list[TokenLogprob] = []

    def body(self) -> bytes:
        """The Response as a non-streamed answer's JSON body (UTF-8)."""
        return _RESPONSE.dump_json(self.response)

    # -- events ---------------------------------------------------------------

    def _next(self) -> int:
        """The next event's ``sequence_number``; take it as the event is written."""
        number = self.sequence
        self.sequence += 1
        return number

    def _response_event(self, kind: ResponseEventType) -> bytes:
        """The Response as it stands, serialized now (later changes are later events')."""
        event: ResponseEvent = {
            "type": kind,
            "sequence_number": self._next(),
            "response": self.response,
        }
        return _frame(_RESPONSE_EVENT, event)

    def _item_event(self, stage: Literal["added", "done"], index: int, item: OutputItem) -> bytes:
        event: OutputItemEvent = {
            "type": "response.output_item.added"
            if stage == "added"
            else "response.output_item.done",
            "sequence_number": self._next(),
            "output_index": index,
            "item": item,
        }
        return _frame(_ITEM_EVENT, event)

    def _add_item(self, item: OutputItem) -> tuple[int, bytes]:
        self.response["output"].append(item)
        index = self._indexes[item["id"]] = len(self.response["output"]) - 1
        return index, self._item_event("added", index, item)

    def created(self) -> list[bytes]:
        """``response.created`` then ``response.in_progress``: generation has begun."""
        return [
            self._response_event("response.created"),
            self._response_event("response.in_progress"),
        ]

    # -- server tools -----------------------------------------------------------

    def _tool_event(
        self, stage: Literal["in_progress", "completed"], index: int, record: ToolCallRecord
    ) -> bytes:
        kind = cast(ServerToolEventType, f"response.{record.kind}_call.{stage}")
        event: ServerToolCallEvent = {
            "type": kind,
            "sequence_number": self._next(),
            "output_index": index,
            "item_id": record.id,
        }
        return _frame(_TOOL_EVENT, event)

    def tool_started(self, record: ToolCallRecord) -> list[bytes]:
        index, added = self._add_item(record.item())
        return [added, self._tool_event("in_progress", index, record)]

    def tool_finished(self, record: ToolCallRecord) -> list[bytes]:
        index = self._indexes[record.id]
        item = record.item()
        self.response["output"][index] = item
        frames = []
        if record.status == "completed":
            frames.append(self._tool_event("completed", index, record))
        frames.append(self._item_event("done", index, item))
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
            if self._reasoning is not None:
                frames += self._close_reasoning()
            if self._calls:
                frames += self._close_calls()
            if self._message is None:
                self._open_message(frames)
            frames.append(self._text_delta(delta.text, _token_logprobs(delta.logprobs)))
        return frames

    def _reasoning_delta(self, text: str) -> list[bytes]:
        frames: list[bytes] = []
        item = self._reasoning
        if item is None:
            item = self._reasoning = {
                "id": _id("rs"),
                "type": "reasoning",
                "status": "in_progress",
                "summary": [],  # docs/reference/responses.md#response-object: summary stays empty
                "content": [],
            }
            index, added = self._add_item(item)
            part: ReasoningTextPart = {"type": "reasoning_text", "text": ""}
            frames += [added, self._part_event("added", item["id"], index, part)]
        self._thought.append(text)
        event: ReasoningTextDeltaEvent = {
            "type": "response.reasoning_text.delta",
            "sequence_number": self._next(),
            "item_id": item["id"],
            "output_index": self._indexes[item["id"]],
            "content_index": 0,
            "delta": text,
        }
        frames.append(_frame(_REASONING_DELTA, event))
        return frames

    def _close_reasoning(self) -> list[bytes]:
        item = self._reasoning
        if item is None or item["status"] != "in_progress":
            return []
        index, text = self._indexes[item["id"]], "".join(self._thought)
        part: ReasoningTextPart = {"type": "reasoning_text", "text": text}
        item["status"] = "completed"
        item["content"] = [part]
        done: ReasoningTextDoneEvent = {
            "type": "response.reasoning_text.done",
            "sequence_number": self._next(),
            "item_id": item["id"],
            "output_index": index,
            "content_index": 0,
            "text": text,
        }
        return [
            _frame(_REASONING_DONE, done),
            self._part_event("done", item["id"], index, part),
            self._item_event("done", index, item),
        ]

    def _function_call(self, call: ToolCallDelta) -> list[bytes]:
        """One fragment: a new ``index`` (or a new ``id`` on it) opens an item."""
        frames: list[bytes] = []
        item = self._calls.get(call.index)
        if item is None or (call.id and call.id != item["call_id"]):
            if item is not None:
                frames += self._close_call(call.index, "completed")
            item = self._calls[call.index] = {
                "id": _id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": call.id or _id("call"),
                "name": call.name,
                "arguments": "",
            }
            frames.append(self._add_item(item)[1])
        if call.arguments:
            item["arguments"] += call.arguments
            event: ArgumentsDeltaEvent = {
                "type": "response.function_call_arguments.delta",
                "sequence_number": self._next(),
                "item_id": item["id"],
                "output_index": self._indexes[item["id"]],
                "delta": call.arguments,
            }
            frames.append(_frame(_ARGUMENTS_DELTA, event))
        return frames

    def _close_call(self, key: int, status: ItemStatus) -> list[bytes]:
        item = self._calls.pop(key)
        index = self._indexes[item["id"]]
        item["status"] = status
        done: ArgumentsDoneEvent = {
            "type": "response.function_call_arguments.done",
            "sequence_number": self._next(),
            "item_id": item["id"],
            "output_index": index,
            "arguments": item["arguments"],
        }
        return [_frame(_ARGUMENTS_DONE, done), self._item_event("done", index, item)]

    def _close_calls(self, last_status: ItemStatus = "completed") -> list[bytes]:
        """Close open calls in output order; ``last_status`` applies to the last item."""
        frames: list[bytes] = []
        keys = sorted(self._calls, key=lambda k: self._indexes[self._calls[k]["id"]])
        for n, key in enumerate(keys):
            frames += self._close_call(key, last_status if n == len(keys) - 1 else "completed")
        return frames

    def _text_delta(self, text: str, logprobs: list[TokenLogprob]) -> bytes:
        """One token's event, the hot path: one dict, one serializer call."""
        item = self._message
        assert item is not None
        self._text.append(text)
        if self.logprobs:
            self._logprobs += logprobs
        event: OutputTextDeltaEvent = {
            "type": "response.output_text.delta",
            "sequence_number": self._next(),
            "item_id": item["id"],
            "output_index": self._indexes[item["id"]],
            "content_index": 0,
            "delta": text,
            "logprobs": logprobs if self.logprobs else [],
        }
        return _frame(_TEXT_DELTA, event)

    def _open_message(self, frames: list[bytes]) -> MessageItem:
        """The message item and its empty part, their events added to ``frames``."""
        item: MessageItem = {
            "id": _id("msg"),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self._message = item
        index, added = self._add_item(item)
        part: OutputTextPart = {"type": "output_text", "text": "", "annotations": []}
        frames += [added, self._part_event("added", item["id"], index, part)]
        return item

    def _part_event(
        self,
        stage: Literal["added", "done"],
        item_id: str,
        index: int,
        part: OutputTextPart | ReasoningTextPart,
    ) -> bytes:
        event: ContentPartEvent = {
            "type": "response.content_part.added"
            if stage == "added"
            else "response.content_part.done",
            "sequence_number": self._next(),
            "item_id": item_id,
            "output_index": index,
            "content_index": 0,
            "part": part,
        }
        return _frame(_PART_EVENT, event)

    def _close_message(self, need_one: bool, status: ItemStatus) -> list[bytes]:
        frames: list[bytes] = []
        item = self._message
        if item is None:
            if not need_one:
                return frames
            item = self._open_message(frames)
        if item["status"] != "in_progress":
            return frames
        item_id, index, text = item["id"], self._indexes[item["id"]], "".join(self._text)
        annotations = self._annotations(text)
        for n, annotation in enumerate(annotations):
            added: AnnotationAddedEvent = {
                "type": "response.output_text.annotation.added",
                "sequence_number": self._next(),
                "item_id": item_id,
                "output_index": index,
                "content_index": 0,
                "annotation_index": n,
                "annotation": annotation,
            }
            frames.append(_frame(_ANNOTATION, added))
        part: OutputTextPart = {"type": "output_text", "text": text, "annotations": annotations}
        if self.logprobs:
            part["logprobs"] = self._logprobs
        item["status"] = status
        item["content"] = [part]
        self.response["output_text"] = text
        done: OutputTextDoneEvent = {
            "type": "response.output_text.done",
            "sequence_number": self._next(),
            "item_id": item_id,
            "output_index": index,
            "content_index": 0,
            "text": text,
            "logprobs": self._logprobs,
        }
        frames.append(_frame(_TEXT_DONE, done))
        frames.append(self._part_event("done", item_id, index, part))
        frames.append(self._item_event("done", index, item))
        return frames

    def _annotations(self, text: str) -> list[UrlCitation]:
        if self.sources is None:
            return []
        return [c.for_responses() for c in self.sources.citations(text)]

    # -- the end ----------------------------------------------------------------

    def _close_all(self, need_message: bool, cut: bool) -> list[bytes]:
        """Close what is open; ``cut``: the output stopped early, so the last item (the
        message, else the last function call) is ``incomplete`` (Open Responses: an
        incomplete item is the last one of an incomplete response)."""
        status: ItemStatus = "incomplete" if cut else "completed"
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

    def _terminal(
        self, status: Terminal, incomplete: IncompleteDetails | None = None
    ) -> list[bytes]:
        if self.terminal:
            return []
        self.terminal = True
        self.response["status"] = status
        self.response["incomplete_details"] = incomplete
        self.response["completed_at"] = int(time.time())
        return [self._response_event(_TERMINAL_EVENT[status])]
