"""Chat completions with server tools: the tool loop rendered as chat (docs/reference/chat.md).

The route sends a chat request here only when it declares a server tool (or
``web_search_options``); everything else stays on ``TextService``. The first
turn is opened by ``TextService`` (same readiness, timeouts, limits), then the
loop runs. A stream carries, besides the answer's chunks, extension chunks
with ``choices: []`` and a ``web_search`` object: one per tool call about to
run (``searching``/``fetching``/``running_code``), the final ``delta.annotations``
chunk, and exactly one ``done`` chunk. Tool failures are silent here
(docs/reference/chat.md#server-tools).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

from serve_app.auth.principal import Principal
from serve_app.catalog.catalog import residency_routing
from serve_app.catalog.config import CatalogModel
from serve_app.inference.answers import Answer
from serve_app.inference.chat.assemble import (
    ChatChunker,
    Collected,
    answer_headers,
    chat_completion_body,
    json_answer,
)
from serve_app.inference.chat.service import TextService
from serve_app.inference.chat.tool_loop import (
    AnswerDelta,
    LoopEvent,
    LoopFinished,
    ToolCallStarted,
    ToolLoop,
)
from serve_app.inference.chat.translate import reject_unencodable, translate_chat
from serve_app.inference.metering import MeteredRequest, RequestMeta
from serve_app.inference.sse import DONE_LINE, sse_error
from serve_app.inference.streams import MeteredStream, sse_stream
from serve_app.protocol.chat import ChatCompletion, ChatCompletionRequest
from serve_app.protocol.errors import InvalidRequestError
from serve_app.tools.declarations import (
    build_plan,
    check_entitlements,
    check_name_clash,
    split_tools,
)
from serve_app.tools.guidance import equip_request
from serve_app.tools.runners import ToolBox, ToolCallRecord, ToolRuntime


def declares_server_tools(body: ChatCompletionRequest) -> bool:
    """Whether a chat request goes through the tool loop."""
    if body.web_search_options is not None:
        return True
    _, servers = split_tools(body.tools)
    return bool(servers)


def activity(record: ToolCallRecord) -> dict[str, Any]:
    """The extension chunk's ``web_search`` object for a call about to run
    (docs/reference/chat.md#streams)."""
    action = record.action
    if record.kind == "web_search":
        return {"status": "searching", "query": action.get("query", "")}
    if record.kind == "web_fetch":
        return {"status": "fetching", "url": action.get("url", "")}
    code = str(action.get("arguments", {}).get("code", ""))
    return {"status": "running_code", "language": "python", "code_chars": len(code)}


class _ChatRun:
    """One chat request through the loop, rendered as JSON or as SSE frames."""

    def __init__(
        self,
        loop: ToolLoop,
        toolbox: ToolBox,
        metered: MeteredRequest,
        model: CatalogModel,
        price_per_search: float,
    ) -> None:
        self.loop = loop
        self.toolbox = toolbox
        self.metered = metered
        self.model = model
        self.price_per_search = price_per_search
        self.request_id = metered.meta.request_id
        self.stream: MeteredStream[LoopEvent] = MeteredStream(
            loop.run(), metered, label="tool loop stream"
        )
        self._text: list[str] = []

    def done_object(self) -> dict[str, Any]:
        return {
            "status": "done",
            "searches": self.toolbox.searches,
            "price_per_search": self.price_per_search,
        }

    def cites(self) -> bool:
        return any(self.toolbox.plan.allows(k) for k in ("web_search", "web_fetch"))

    async def body(self) -> ChatCompletion:
        collected = Collected()
        await self.stream.drain(functools.partial(_collect, collected))
        separate = self.model.reasoning.separate_channel
        body = chat_completion_body(self.request_id, self.model.id, collected, 1, separate)
        message = body.choices[0].message
        if self.cites():
            citations = self.toolbox.sources.citations(message.content or "")
            message.annotations = [c.for_chat() for c in citations]
        if self.toolbox.used.get("web_search"):
            body.web_search = {
                "searches": self.toolbox.searches,
                "price_per_search": self.price_per_search,
            }
        return body

    def frames(self, include_usage: bool) -> AsyncIterator[bytes]:
        chunker = ChatChunker(self.request_id, self.model.id, self.model.reasoning.separate_channel)
        closing = [DONE_LINE]
        routing = residency_routing(self.model)
        if routing is not None:
            closing.insert(0, chunker.routing(routing.model_dump(exclude_none=True)))
        return self.stream.relay(
            functools.partial(self._chunks, chunker, include_usage),
            opening=[chunker.role(1)],
            on_failure=lambda err: [chunker.web_search(self.done_object()), sse_error(err)],
            closing=closing,
        )

    def _chunks(self, chunker: ChatChunker, include_usage: bool, event: LoopEvent) -> list[bytes]:
        if isinstance(event, ToolCallStarted):
            return [chunker.web_search(activity(event.record))]
        if isinstance(event, AnswerDelta):
            if event.delta.text:
                self._text.append(event.delta.text)
            chunks = []
            if event.delta.finish_reason is not None:
                # docs/reference/chat.md#streams: the final content chunk carries delta.annotations;
                # with no web tool declared (or nothing found) the list is empty.
                chunks.append(self._annotations(chunker))
            chunk = chunker.delta(event.delta)
            return chunks + ([chunk] if chunk is not None else [])
        if not isinstance(event, LoopFinished):
            return []
        chunks = [chunker.web_search(self.done_object())]
        if include_usage:
            chunks.append(chunker.usage(event.done))
        return chunks

    def _annotations(self, chunker: ChatChunker) -> bytes:
        citations = self.toolbox.sources.citations("".join(self._text))
        return chunker.annotations([c.for_chat() for c in citations])


class ToolChatService:
    """Chat requests that declare server tools."""

    def __init__(self, text: TextService, runtime: ToolRuntime) -> None:
        self.text = text
        self.runtime = runtime

    async def answer(self, body: ChatCompletionRequest, principal: Principal) -> Answer:
        """A chat request however it is served: the gateway's tool loop when it declares
        server tools (docs/reference/chat.md#server-tools), else the text service. The route
        and a batch line (``serve_app.batches.endpoints``) both come here: the same rules."""
        reject_unencodable(body)
        if declares_server_tools(body):
            return await self.chat(body, principal)
        return await self.text.chat(body, principal)

    async def chat(self, body: ChatCompletionRequest, principal: Principal) -> Answer:
        model = await self.text.resolve(body.model, principal)
        functions, servers = split_tools(body.tools)
        plan = build_plan(servers, body.web_search_options)
        check_entitlements(plan, principal, model)
        check_name_clash(functions, plan)
        if body.n > 1:
            raise InvalidRequestError(
                "n > 1 is not supported together with server tools.",
                code="unsupported_parameter",
                param="n",
            )
        translated = await translate_chat(body, model, self.text.images)
        relayed = translated.head_request.prompts[0].tools or []
        request = equip_request(
            translated.head_request,
            plan,
            relayed,
            body.tool_choice,
            search_scope=self.runtime.search_scope,
        )
        meta = RequestMeta(principal, model, "chat", request.request_id, 1)
        started, events, metered = await self.text.open_turn(meta, request)
        toolbox = ToolBox(self.runtime, plan)
        loop = ToolLoop(
            request=request,
            first_events=events,
            start_turn=functools.partial(self.text.start_turn, model),
            metered=metered,
            toolbox=toolbox,
            functions=relayed,
        )
        run = _ChatRun(
            loop, toolbox, metered, model, self.runtime.options.web_search.price_per_search
        )
        headers = answer_headers(translated.ignored_params + started.ignored_params, model)
        if not body.stream:
            return json_answer(await _with_routing(run, model), headers)
        return sse_stream(run.stream, run.frames(body.include_usage()), headers)


def _collect(collected: Collected, event: LoopEvent) -> None:
    if isinstance(event, AnswerDelta):
        collected.add(event.delta)
    elif isinstance(event, LoopFinished):
        collected.done = event.done


async def _with_routing(run: _ChatRun, model: CatalogModel) -> ChatCompletion:
    body = await run.body()
    routing = residency_routing(model)
    if routing is not None:
        body.routing = routing.model_dump(exclude_none=True)
    return body
