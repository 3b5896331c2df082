"""The server-tool loop shared by chat and responses (docs/reference/README.md,
docs/reference/chat.md#server-tools, docs/reference/responses.md#request).

One request may take several model turns: the model calls ``web_search`` /
``web_fetch`` / ``code_interpreter``, the gateway runs the tool, appends the
call and its result to the conversation, and asks again, until the model
answers, calls a client function, or the budgets run out (then the server
tools are no longer offered, so the model must answer).

The loop yields route-neutral events; chat and responses render them. Two
choices keep both renderings simple and the responses item order of
docs/reference/responses.md#response-object (tool calls, reasoning, function calls, message) true in
the stream too:

- When the request declares any tool, each turn is held until it ends: only
  then is it known whether the turn is the answer or a tool round. Text of a
  tool round is the model thinking aloud and is not part of the answer; its
  reasoning is kept and sent before the answer's. Without tools, deltas pass
  through live (the common case keeps token streaming).
- Every head event is metered as it arrives, with completion counts made
  cumulative over turns, so a request that breaks in turn three bills all
  three turns; each later turn's prompt is billed too (``add_turn``).

Failures of the model raise ``GatewayError``; the renderer decides whether
that is an HTTP status, an SSE error, or an incomplete/failed response.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from serve_app.contract.chat import (
    GenerationDone,
    HeadEvent,
    HeadRequest,
    HeadStarted,
    PromptSpec,
    TextDelta,
    ToolCallDelta,
    merge_tool_call,
)
from serve_app.contract.errors import HeadFailure
from serve_app.inference.metering import MeteredRequest
from serve_app.inference.streams import aclose_quietly
from serve_app.protocol.errors import UpstreamError
from serve_app.tools.citations import drop_unbacked
from serve_app.tools.declarations import ServerToolPlan
from serve_app.tools.guidance import tool_schemas
from serve_app.tools.runners import Refusal, ToolBox, ToolCallRecord

TurnStarter = Callable[[HeadRequest], Awaitable[tuple[HeadStarted, AsyncIterator[HeadEvent]]]]


@dataclass
class ToolCallStarted:
    record: ToolCallRecord


@dataclass
class ToolCallFinished:
    record: ToolCallRecord


@dataclass
class AnswerDelta:
    """Output of the answering turn: reasoning, text, client calls, or the finish reason."""

    delta: TextDelta


@dataclass
class LoopFinished:
    done: GenerationDone
    finish_reason: str


LoopEvent = ToolCallStarted | ToolCallFinished | AnswerDelta | LoopFinished


@dataclass
class _Turn:
    """Everything one model turn produced."""

    deltas: list[TextDelta] = field(default_factory=list)
    calls: list[ToolCallDelta] = field(default_factory=list)
    finish_reason: str | None = None
    fragments: list[tuple[int, ToolCallDelta]] = field(default_factory=list)
    """Each call fragment as the head sent it, with its call's position in ``calls``."""

    def add(self, delta: TextDelta) -> None:
        self.deltas.append(delta)
        for call in delta.tool_calls:
            self._add_call(call)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason

    def _add_call(self, call: ToolCallDelta) -> None:
        """Fragments of one call (same index, no new id) are joined."""
        position = merge_tool_call(self.calls, call)
        if not self.calls[position].id:
            self.calls[position].id = f"call_{uuid.uuid4().hex[:24]}"
        self.fragments.append((position, call))

    def text(self) -> str:
        return "".join(d.text for d in self.deltas)

    def reasoning(self) -> str:
        return "".join(d.reasoning for d in self.deltas)


class ToolLoop:
    """Runs one request's turns; iterate ``run()`` once."""

    def __init__(
        self,
        *,
        request: HeadRequest,
        first_events: AsyncIterator[HeadEvent],
        start_turn: TurnStarter,
        metered: MeteredRequest,
        toolbox: ToolBox | None,
        functions: list[dict[str, Any]],
        call_fragments: bool = False,
    ) -> None:
        """``call_fragments``: release a held turn's client calls as the head's fragments
        (the responses route streams one arguments delta per fragment), not joined."""
        self.call_fragments = call_fragments
        self.request = request
        self.prompt: PromptSpec = request.prompts[0]
        self.start_turn = start_turn
        self.metered = metered
        self.toolbox = toolbox
        self.functions = functions
        self.buffered = bool(functions) or toolbox is not None
        budgets = toolbox.plan.budgets.values() if toolbox is not None else ()
        self.max_turns = sum(budgets) + 1
        self.totals = GenerationDone(prompt_tokens=0, completion_tokens=0)
        self._events = first_events

    async def run(self) -> AsyncIterator[LoopEvent]:
        messages = list(self.prompt.messages or [])
        earlier_reasoning = ""
        try:
            for turn_no in range(self.max_turns):
                turn = _Turn()
                try:
                    async for delta in self._consume(turn):
                        yield AnswerDelta(delta)
                except Exception:
                    for delta in self._partial(turn, earlier_reasoning):
                        yield AnswerDelta(delta)
                    raise
                server_calls = self._server_calls(turn, turn_no)
                if server_calls is None:
                    async for event in self._answer(turn, earlier_reasoning):
                        yield event
                    return
                earlier_reasoning += turn.reasoning()
                messages.append(_assistant_message(turn.text(), server_calls))
                async for event in self._run_tools(server_calls, messages):
                    yield event
                started, self._events = await self.start_turn(
                    self._next_request(messages, turn_no + 1)
                )
                self.metered.add_turn(started.prompt_tokens)
        finally:
            await aclose_quietly(self._events)

    def _partial(self, turn: _Turn, earlier_reasoning: str) -> list[TextDelta]:
        """What a held turn produced before the model broke: the partial answer.

        Without this, declaring a tool would turn "stream broke after partial
        text" (``incomplete``, text billed) into "no answer" (``failed``).
        Client calls of a broken turn are not released: they may be cut off.
        """
        if not self.buffered:
            return []  # already sent as it arrived
        reasoning = earlier_reasoning + turn.reasoning()
        deltas = [TextDelta(0, reasoning=reasoning)] if reasoning else []
        return deltas + [TextDelta(0, text=d.text) for d in turn.deltas if d.text]

    async def _consume(self, turn: _Turn) -> AsyncIterator[TextDelta]:
        """Meter and collect one turn; pass deltas through when nothing is held."""
        done: GenerationDone | None = None
        async for event in self._events:
            if isinstance(event, TextDelta):
                cumulative = self.totals.completion_tokens + event.completion_tokens
                self.metered.observe(dataclasses.replace(event, completion_tokens=cumulative))
                turn.add(event)
                if not self.buffered:
                    yield event
            elif isinstance(event, GenerationDone):
                done = event
            elif isinstance(event, HeadFailure):
                raise event.to_error()
        if done is None:
            raise UpstreamError("The model stream ended without a result.")
        self.totals.add(done)

    def _server_calls(self, turn: _Turn, turn_no: int) -> list[ToolCallDelta] | None:
        """The calls to run, or None when this turn is the answer."""
        if self.toolbox is None or not turn.calls or turn_no >= self.max_turns - 1:
            return None
        if turn.finish_reason == "length" or self._tokens_left() == 0:
            return None
        server = [c for c in turn.calls if self.toolbox.plan.allows(c.name)]
        if not server or len(server) < len(turn.calls):
            return None  # a client function call ends the loop: the client runs it
        return server

    def _client_calls(self, turn: _Turn) -> list[ToolCallDelta]:
        plan = self.toolbox.plan if self.toolbox is not None else None
        calls = [c for c in turn.calls if plan is None or not plan.allows(c.name)]
        return [dataclasses.replace(c, index=i) for i, c in enumerate(calls)]

    def _client_fragments(self, turn: _Turn) -> list[ToolCallDelta]:
        """The client calls' fragments in arrival order, numbered like ``_client_calls``;
        only a call's first fragment names its id and function."""
        plan = self.toolbox.plan if self.toolbox is not None else None
        positions = [i for i, c in enumerate(turn.calls) if plan is None or not plan.allows(c.name)]
        number = {position: n for n, position in enumerate(positions)}
        fragments: list[ToolCallDelta] = []
        seen: set[int] = set()
        for position, fragment in turn.fragments:
            if position not in number:
                continue
            call, first = turn.calls[position], position not in seen
            seen.add(position)
            fragments.append(
                ToolCallDelta(
                    call.id if first else "",
                    call.name if first else "",
                    fragment.arguments,
                    number[position],
                )
            )
        return fragments

    async def _answer(self, turn: _Turn, earlier_reasoning: str) -> AsyncIterator[LoopEvent]:
        """The answering turn, in item order: reasoning, client calls, text, finish."""
        finish = turn.finish_reason or "stop"
        calls = self._client_calls(turn)
        if finish == "tool_calls" and not calls:
            # Only server calls the loop could no longer run (budget, last turn,
            # output cap): the client has nothing to execute, so the answer is the
            # text so far, cut by the output cap or not.
            finish = "length" if self._tokens_left() == 0 else "stop"
        if self.buffered:
            reasoning = earlier_reasoning + turn.reasoning()
            if reasoning:
                yield AnswerDelta(TextDelta(0, reasoning=reasoning))
            if calls:
                finish = "tool_calls"
                released = self._client_fragments(turn) if self.call_fragments else calls
                yield AnswerDelta(TextDelta(0, tool_calls=released))
            for delta in self._answer_text(turn):
                yield AnswerDelta(delta)
            yield AnswerDelta(TextDelta(0, finish_reason=finish))
        self.metered.observe(self.totals)
        yield LoopFinished(self.totals, finish)

    def _answer_text(self, turn: _Turn) -> list[TextDelta]:
        """The held answer's text deltas, as the head sent them, unless a citation marker
        names no source of the request (``drop_unbacked``): then the cleaned text, whole
        (its logprobs would no longer match it)."""
        deltas = [TextDelta(0, text=d.text, logprobs=d.logprobs) for d in turn.deltas if d.text]
        if self.toolbox is None or not self.toolbox.plan.cites:
            return deltas
        text = turn.text()
        cleaned = drop_unbacked(text, self.toolbox.sources)
        if cleaned == text:
            return deltas
        return [TextDelta(0, text=cleaned)] if cleaned else []

    async def _run_tools(
        self, calls: list[ToolCallDelta], messages: list[dict[str, Any]]
    ) -> AsyncIterator[LoopEvent]:
        assert self.toolbox is not None
        for call in calls:
            prepared = self.toolbox.prepare(call)
            if isinstance(prepared, Refusal):
                content = prepared.message
            else:
                yield ToolCallStarted(prepared)
                content = await self.toolbox.run(prepared)
                searches, seconds = self.toolbox.take_billable()
                self.metered.add_tool_use(web_searches=searches, code_seconds=seconds)
                yield ToolCallFinished(prepared)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})

    def _tokens_left(self) -> int | None:
        if self.request.max_tokens is None:
            return None
        return max(self.request.max_tokens - self.totals.completion_tokens, 0)

    def _next_request(self, messages: list[dict[str, Any]], turn_no: int) -> HeadRequest:
        assert self.toolbox is not None
        last = turn_no >= self.max_turns - 1
        names = [] if last else self.toolbox.live_tools()
        scope = self.toolbox.runtime.search_scope
        tools = self.functions + tool_schemas(self.toolbox.plan, names, search_scope=scope)
        choice = self.prompt.tool_choice
        forcing = isinstance(choice, str) and choice not in ("none", "auto")  # "required"
        if forcing or _names_server_tool(choice, self.toolbox.plan):
            choice = "auto"  # met by the first round; the model may answer now
        prompt = dataclasses.replace(
            self.prompt,
            messages=messages,
            tools=tools or None,
            tool_choice=choice if tools else None,
        )
        return dataclasses.replace(
            self.request,
            request_id=f"{self.request.request_id}-t{turn_no}",
            prompts=[prompt],
            max_tokens=self._tokens_left(),
        )


def _names_server_tool(choice: Any, plan: ServerToolPlan) -> bool:
    """A chat ``tool_choice`` forcing a server tool (chat relays it; forced once)."""
    if not isinstance(choice, dict):
        return False
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else choice.get("name")
    return isinstance(name, str) and plan.allows(name)


def _assistant_message(text: str, calls: list[ToolCallDelta]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ],
    }
