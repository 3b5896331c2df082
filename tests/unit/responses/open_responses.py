"""Strict validation of ``/v1/responses`` output against Open Responses (OpenAPI 2026-04-24).

The core is checked with the pydantic models of ``openresponses-types``, in strict
JSON mode. Two things the seeds rule lie outside that core, and both are
documented in docs/api.md as the route's extensions (Open Responses allows a proper
superset; unknown item and event types are to be ignored by clients):

- server-tool items (``web_search_call``, ``web_fetch_call``, ``code_interpreter_call``)
  in ``output``, their declarations in ``tools``, and their
  ``response.<tool>_call.in_progress`` / ``.completed`` events;
- ``response.reasoning_text.delta`` / ``.done`` on separate-channel models (the seeds'
  names; the core's reasoning item and ``reasoning_text`` content part are used as is).

Those are validated here against the gateway's own strict models, then removed, and
what remains must be a valid core object. The one deliberate deviation (spec 2.7,
2.10: ``usage.output_tokens_details`` absent when the engine reports no reasoning
split) is checked the same way: the usage must be a valid core Usage but for that
key. Every extension and deviation met is recorded, so a test can assert that
nothing else slipped through.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import openresponses_types as ort
from pydantic import BaseModel, ConfigDict

SPEC_VERSION = "2026-04-24"
SERVER_TOOL_ITEMS = frozenset({"web_search_call", "web_fetch_call", "code_interpreter_call"})
SERVER_TOOLS = frozenset({"web_search", "web_fetch", "code_interpreter"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ServerToolCallItem(_Strict):
    id: str
    type: Literal["web_search_call", "web_fetch_call", "code_interpreter_call"]
    status: Literal["in_progress", "completed", "failed"]
    action: dict[str, Any]
    outputs: list[dict[str, str]] | None = None
    error: dict[str, str] | None = None


class ServerToolDeclaration(_Strict):
    type: Literal["web_search", "web_fetch", "code_interpreter"]
    max_uses: int
    search_context_size: Literal["low", "medium", "high"] | None = None
    timeout_s: float | None = None


class UsageWithoutSplit(ort.Usage):
    """Core Usage but for the documented deviation: no reasoning split reported."""

    output_tokens_details: None = None  # type: ignore[assignment]


class ServerToolCallEvent(_Strict):
    type: str
    sequence_number: int
    output_index: int
    item_id: str


class ReasoningTextDelta(_Strict):
    type: Literal["response.reasoning_text.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningTextDone(_Strict):
    type: Literal["response.reasoning_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str


CORE_EVENTS: dict[str, type[BaseModel]] = {
    "response.created": ort.ResponseCreatedStreamingEvent,
    "response.queued": ort.ResponseQueuedStreamingEvent,
    "response.in_progress": ort.ResponseInProgressStreamingEvent,
    "response.completed": ort.ResponseCompletedStreamingEvent,
    "response.failed": ort.ResponseFailedStreamingEvent,
    "response.incomplete": ort.ResponseIncompleteStreamingEvent,
    "response.output_item.added": ort.ResponseOutputItemAddedStreamingEvent,
    "response.output_item.done": ort.ResponseOutputItemDoneStreamingEvent,
    "response.content_part.added": ort.ResponseContentPartAddedStreamingEvent,
    "response.content_part.done": ort.ResponseContentPartDoneStreamingEvent,
    "response.output_text.delta": ort.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": ort.ResponseOutputTextDoneStreamingEvent,
    "response.output_text.annotation.added": ort.ResponseOutputTextAnnotationAddedStreamingEvent,
    "response.refusal.delta": ort.ResponseRefusalDeltaStreamingEvent,
    "response.refusal.done": ort.ResponseRefusalDoneStreamingEvent,
    "response.reasoning.delta": ort.ResponseReasoningDeltaStreamingEvent,
    "response.reasoning.done": ort.ResponseReasoningDoneStreamingEvent,
    "response.function_call_arguments.delta": ort.ResponseFunctionCallArgumentsDeltaStreamingEvent,
    "response.function_call_arguments.done": ort.ResponseFunctionCallArgumentsDoneStreamingEvent,
    "error": ort.ErrorStreamingEvent,
}
_RESPONSE_EVENTS = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.completed",
        "response.failed",
        "response.incomplete",
    }
)
_REASONING_TEXT: dict[str, type[BaseModel]] = {
    "response.reasoning_text.delta": ReasoningTextDelta,
    "response.reasoning_text.done": ReasoningTextDone,
}


class Conformance:
    """Validates bodies and events; ``extensions`` names every extension type met."""

    def __init__(self) -> None:
        self.extensions: set[str] = set()

    def response(self, body: dict[str, Any]) -> ort.ResponseResource:
        core = self._core(body)
        return ort.ResponseResource.model_validate_json(json.dumps(core), strict=True)

    def _core(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` without its (validated) extensions: what the core schema must accept."""
        core = dict(body)
        core["output"] = [self._item_or_none(item) for item in body["output"]]
        core["output"] = [item for item in core["output"] if item is not None]
        usage = body.get("usage")
        if usage is not None and "output_tokens_details" not in usage:
            UsageWithoutSplit.model_validate_json(json.dumps(usage), strict=True)
            self.extensions.add("deviation:usage.output_tokens_details")
            core["usage"] = None  # checked above; the rest must be core
        core["tools"] = []
        for tool in body["tools"]:
            if tool.get("type") in SERVER_TOOLS:
                ServerToolDeclaration.model_validate_json(json.dumps(tool))
                self.extensions.add(f"tool:{tool['type']}")
            else:
                core["tools"].append(tool)
        return core

    def _item_or_none(self, item: dict[str, Any]) -> dict[str, Any] | None:
        if item.get("type") in SERVER_TOOL_ITEMS:
            ServerToolCallItem.model_validate_json(json.dumps(item))
            self.extensions.add(f"item:{item['type']}")
            return None
        return item

    def event(self, event: dict[str, Any]) -> BaseModel | None:
        kind = event["type"]
        if kind in _REASONING_TEXT:
            self.extensions.add(f"event:{kind}")
            return _REASONING_TEXT[kind].model_validate_json(json.dumps(event))
        if kind.startswith("response.") and kind.split(".")[1] in SERVER_TOOL_ITEMS:
            assert kind.rsplit(".", 1)[1] in ("in_progress", "completed"), kind
            self.extensions.add(f"event:{kind}")
            return ServerToolCallEvent.model_validate_json(json.dumps(event))
        if kind in _RESPONSE_EVENTS:
            event = {**event, "response": self._core(event["response"])}
        item: dict[str, Any] = event.get("item") or {}
        if kind.startswith("response.output_item.") and item.get("type") in SERVER_TOOL_ITEMS:
            self._item_or_none(item)
            return None
        model = CORE_EVENTS[kind]  # a KeyError is an event type outside schema and extensions
        return model.model_validate_json(json.dumps(event), strict=True)

    def stream(self, events: list[dict[str, Any]]) -> None:
        """Every event valid; created, then in_progress; numbers 0, 1, 2..."""
        for event in events:
            self.event(event)
        assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
