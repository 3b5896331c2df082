"""Chat and legacy completions: resolve, translate, call the head, answer.

Routes stay thin by handing the validated body and the caller to
``TextService``; this module decides stream vs. JSON and owns the order of
the checks (catalog -> translation -> readiness -> head -> limits). Limits come
after the head accepted the prompt because only then is the token count known;
a 429 closes the head stream, which aborts the generation. Whatever way an
admitted request ends, ``MeteredStream`` (``serve_app.inference.streams``)
closes the head and runs its ``MeteredRequest.finish`` once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from serve_app.auth.principal import Principal
from serve_app.catalog.catalog import Catalog, residency_routing
from serve_app.catalog.config import CatalogModel
from serve_app.contract.chat import GenerationDone, HeadEvent, HeadRequest, HeadStarted, TextDelta
from serve_app.heads.client import HeadClient
from serve_app.inference.answers import Answer
from serve_app.inference.chat.assemble import (
    ChatChunker,
    Collected,
    CompletionChunker,
    answer_headers,
    chat_completion_body,
    completion_body,
    json_answer,
)
from serve_app.inference.chat.translate import Translated, translate_chat, translate_completion
from serve_app.inference.images import ImagePolicy
from serve_app.inference.metering import MeteredRequest, Metering, RequestMeta
from serve_app.inference.readiness import HeadReadiness
from serve_app.inference.sse import DONE_LINE
from serve_app.inference.streams import (
    MeteredStream,
    aclose_quietly,
    peek_first_output,
    read_head_started,
    sse_stream,
    with_timeouts,
)
from serve_app.protocol.chat import ChatCompletion, ChatCompletionRequest
from serve_app.protocol.completions import Completion, CompletionRequest
from serve_app.protocol.errors import ModelUnavailableError, UpstreamError


class AdapterResolver(Protocol):
    """``serve_app.adapters.service.AdapterService``: an organization's adapters by id."""

    async def resolve(self, model_id: str, principal: Principal) -> CatalogModel | None: ...

    def resolve_blocking(self, model_id: str, principal: Principal) -> CatalogModel | None: ...


@dataclass(frozen=True)
class TimeoutPolicy:
    """How long the gateway waits for a head before answering 504."""

    first_event_s: float = 120.0
    idle_s: float = 60.0


class TextService:
    """Serves the text-generation routes for every chat model of the catalog."""

    def __init__(
        self,
        catalog: Catalog,
        heads: dict[str, HeadClient],
        readiness: HeadReadiness,
        images: ImagePolicy,
        timeouts: TimeoutPolicy,
        metering: Metering | None = None,
        head_lookup: Callable[[str], HeadClient | None] | None = None,
        adapters: AdapterResolver | None = None,
    ) -> None:
        self.catalog = catalog
        self.heads = heads
        self.readiness = readiness
        self.images = images
        self.timeouts = timeouts
        self.metering = metering or Metering()
        self.head_lookup = head_lookup
        """Heads not in ``heads`` (dedicated endpoints: ``DedicatedRouter.head_for``)."""
        self.adapters = adapters
        """Organizations' LoRA adapters (``<base>:<name>`` ids; the catalog's own are
        resolved by the catalog)."""

    async def resolve(self, model_id: str, principal: Principal) -> CatalogModel:
        """The chat model (or LoRA adapter) ``model_id`` names for this caller, or the
        API's error (docs/reference/adapters.md#addressing)."""
        adapter = None
        if self.adapters is not None:
            adapter = await self.adapters.resolve(model_id, principal)
        return self._or_catalog(adapter, model_id, principal)

    def resolve_blocking(self, model_id: str, principal: Principal) -> CatalogModel:
        """``resolve`` off the event loop (blocking: an organization's adapter is read
        from SQL in the calling thread); batch validation checks each line's model so."""
        adapter = None
        if self.adapters is not None:
            adapter = self.adapters.resolve_blocking(model_id, principal)
        return self._or_catalog(adapter, model_id, principal)

    def _or_catalog(
        self, adapter: CatalogModel | None, model_id: str, principal: Principal
    ) -> CatalogModel:
        """The adapter, else the catalog's model (its 404/403/400 where it has none)."""
        if adapter is not None:
            return adapter
        return self.catalog.resolve(model_id, principal, "chat")

    async def chat(self, body: ChatCompletionRequest, principal: Principal) -> Answer:
        model = await self.resolve(body.model, principal)
        translated = await translate_chat(body, model, self.images)
        separate = model.reasoning.separate_channel
        return await self._serve(
            RequestMeta(principal, model, "chat", translated.head_request.request_id, body.n),
            translated,
            stream=body.stream,
            include_usage=body.include_usage(),
            body_builder=lambda rid, collected: chat_completion_body(
                rid, model.id, collected, body.n, separate
            ),
            chunker_factory=lambda rid: ChatChunker(rid, model.id, separate),
        )

    async def completion(self, body: CompletionRequest, principal: Principal) -> Answer:
        model = await self.resolve(body.model, principal)
        translated = translate_completion(body, model)
        n_choices = body.n * len(body.prompts())
        separate = model.reasoning.separate_channel
        return await self._serve(
            RequestMeta(
                principal, model, "completions", translated.head_request.request_id, n_choices
            ),
            translated,
            stream=body.stream,
            include_usage=body.include_usage(),
            body_builder=lambda rid, collected: completion_body(
                rid, model.id, collected, n_choices, separate
            ),
            chunker_factory=lambda rid: CompletionChunker(rid, model.id, separate),
        )

    async def _serve(
        self,
        meta: RequestMeta,
        translated: Translated,
        *,
        stream: bool,
        include_usage: bool,
        body_builder: Callable[[str, Collected], ChatCompletion | Completion],
        chunker_factory: Callable[[str], ChatChunker | CompletionChunker],
    ) -> Answer:
        request = translated.head_request
        started, events, metered = await self._open(meta, request)
        headers = answer_headers(translated.ignored_params + started.ignored_params, meta.model)
        routing = residency_routing(meta.model)
        answer = MeteredStream(events, metered, observe=metered.observe)
        if not stream:
            collected = Collected()
            await answer.drain(collected.take)
            if collected.done is None:
                raise UpstreamError("The model stream ended without a result.")
            body = body_builder(request.request_id, collected)
            if routing is not None:
                body.routing = routing.model_dump(exclude_none=True)
            return json_answer(body, headers)
        chunker = chunker_factory(request.request_id)
        first = chunker.role(meta.n_choices)
        # An externally served stream ends with one ``routing`` chunk just before
        # ``[DONE]`` (docs/reference/common.md#external-models), whatever happened before it.
        closing = [DONE_LINE]
        if routing is not None:
            closing.insert(0, chunker.routing(routing.model_dump(exclude_none=True)))
        frames = answer.relay(
            functools.partial(_chunks, chunker, include_usage),
            opening=[first] if first is not None else [],
            closing=closing,
        )
        return sse_stream(answer, frames, headers)

    async def _open(
        self, meta: RequestMeta, request: HeadRequest
    ) -> tuple[HeadStarted, AsyncIterator[HeadEvent], MeteredRequest]:
        """Start the head, admit on its acceptance, then wait for the first output.

        Nothing is reserved for a request the head refuses (400, 503). Admission
        comes before the first token is awaited: a 429 closes the head stream
        before anything was generated for it (or, on an external model, before
        the provider is called), so refused requests cost no engine work. A
        failure before the first output is still a real status, and releases
        the reservation unbilled.
        """
        request.org_id = meta.principal.org_id  # the prefix router's namespace
        try:
            started, events = await self._begin(meta.model, request)
        except Exception:
            self.metering.failed(meta)
            raise
        try:
            metered = await self.metering.admit(meta, started)
        except BaseException:
            await aclose_quietly(events)  # a 429 stops the head before it generates
            raise
        try:
            events = await peek_first_output(events, metered.observe_first)
        except BaseException as exc:
            await metered.finish(aborted=isinstance(exc, asyncio.CancelledError))
            raise
        return started, events, metered

    async def _start(
        self, model: CatalogModel, request: HeadRequest
    ) -> tuple[HeadStarted, AsyncIterator[HeadEvent]]:
        started, events = await self._begin(model, request)
        return started, await peek_first_output(events)

    async def _begin(
        self, model: CatalogModel, request: HeadRequest
    ) -> tuple[HeadStarted, AsyncIterator[HeadEvent]]:
        """Call the head and read its acceptance (``HeadStarted``), nothing more.

        An adapter's request goes to its base model's head, with the adapter named.
        """
        head_id = model.head_id
        client = self.heads.get(head_id)
        if client is None and self.head_lookup is not None:
            client = self.head_lookup(head_id)  # ded/<slug>: 503 while warming
        if client is None:
            raise ModelUnavailableError(f"Model '{model.id}' has no serving head.")
        self.readiness.check(head_id)
        request.adapter = model.adapter_ref
        # A client may need longer for its first event (a dedicated call that boots a
        # replica from zero waits for that boot); it says so with ``first_event_s``.
        first_event_s = max(
            getattr(client, "first_event_s", None) or 0.0, self.timeouts.first_event_s
        )
        events = with_timeouts(
            client.stream(request),
            first_event_s,
            self.timeouts.idle_s,
            model.id,
        )
        started = await read_head_started(events)
        self.readiness.note_answering(head_id)
        return started

    async def prompt_tokens(self, body: ChatCompletionRequest, model: CatalogModel) -> int:
        """The prompt's token count as ``model``'s head renders it; the head's stream is
        closed on its acceptance, before anything is generated (``/v1/messages/count_tokens``)."""
        translated = await translate_chat(body, model, self.images)
        started, events = await self._begin(model, translated.head_request)
        await aclose_quietly(events)
        return started.prompt_tokens

    # The server-tool loop and the responses route open turns the same way.
    async def open_turn(
        self, meta: RequestMeta, request: HeadRequest
    ) -> tuple[HeadStarted, AsyncIterator[HeadEvent], MeteredRequest]:
        """First turn of a request: head started and limits admitted (see ``_open``)."""
        return await self._open(meta, request)

    async def start_turn(
        self, model: CatalogModel, request: HeadRequest
    ) -> tuple[HeadStarted, AsyncIterator[HeadEvent]]:
        """A later turn of an admitted request (no new admission)."""
        return await self._start(model, request)


def _chunks(
    chunker: ChatChunker | CompletionChunker, include_usage: bool, event: HeadEvent
) -> Iterable[bytes]:
    """The SSE frames of one head event: a delta's chunk, the usage chunk if asked for."""
    if isinstance(event, TextDelta):
        chunk = chunker.delta(event)
        return () if chunk is None else (chunk,)
    if isinstance(event, GenerationDone) and include_usage:
        return (chunker.usage(event),)
    return ()
