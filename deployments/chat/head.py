"""The text head: one Ray Serve deployment per chat model of the catalog.

``ChatHeadCore`` holds the logic that needs the model's tokenizer (context
window checks, sizing ``max_tokens`` when omitted, relayed-parameter filtering)
and is plain async Python, so the gateway's tests can run it in-process.
``ChatHead`` is the thin Ray Serve wrapper the Serve config deploys.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from ray import serve

from deployments.chat.adapters import (
    AdapterFiles,
    AdapterSlots,
    MultiplexedAdapter,
    drop_multiplexed,
)
from deployments.chat.base import EngineInfo, PreparedPrompt, TextEngine
from deployments.chat.invented_calls import declared_names, invented_call
from deployments.replica_logging import configure_replica_logging
from deployments.stream_batching import (
    DEFAULT_INTERVAL_S,
    DEFAULT_MAX_INTERVAL_S,
    DEFAULT_MESSAGES_PER_S,
    StreamLoad,
    coalesce,
)
from serve_app.contract.adapters import AdapterObjects, AdapterRef, BaseShapes, ForgetReply
from serve_app.contract.chat import (
    GenerationDone,
    HeadEvent,
    HeadRequest,
    HeadStarted,
    PromptSpec,
    SamplingSpec,
    TextDelta,
)
from serve_app.contract.errors import (
    GatewayError,
    HeadFailure,
    InvalidRequestError,
    UpstreamError,
    model_not_found,
)

logger = logging.getLogger(__name__)

_STREAM_END = object()


class ChatHeadCore:
    """Guardrails and stream framing around one ``TextEngine``.

    ``adapters``: the LoRA adapters loaded into the engine (None: the head serves none);
    ``ensure_adapter`` loads one before a request uses it: the slots' own LRU in process,
    Ray Serve's multiplexing in a replica (``ChatHead``).

    ``answer_invented_calls``: when a turn offered tools with ``tool_choice`` auto opens
    with a call to a function the request did not declare (deployments/chat/invented_calls.py),
    the turn is generated again without tools, so the user gets an answer instead of a
    made-up call (docs/models.md, "Tool decisions").
    """

    def __init__(
        self,
        engine: TextEngine,
        adapters: AdapterSlots | None = None,
        *,
        answer_invented_calls: bool = True,
    ) -> None:
        self.engine = engine
        self.info: EngineInfo | None = None
        self.adapters = adapters
        self.ensure_adapter: Callable[[AdapterRef], Awaitable[Any]] | None = (
            adapters.load if adapters is not None else None
        )
        self.answer_invented_calls = answer_invented_calls

    async def start(self) -> EngineInfo:
        self.info = await self.engine.start()
        return self.info

    async def generate(self, request: HeadRequest) -> AsyncIterator[HeadEvent]:
        """Yield ``HeadStarted`` then deltas then ``GenerationDone``; failures as events.

        An adapter request loads its adapter first (a failure is the request's error)
        and keeps it pinned until the stream ends.
        """
        ref = request.adapter
        if ref is None:
            async for event in self._generate(request):
                yield event
            return
        try:
            if self.adapters is None or self.ensure_adapter is None:
                raise model_not_found(ref.model_id)
            await self.ensure_adapter(ref)
        except GatewayError as err:
            yield HeadFailure.from_error(err)
            return
        except Exception as err:
            logger.exception("adapter %s failed to load", ref.model_id)
            yield HeadFailure.from_error(UpstreamError(f"The adapter failed to load: {err}"))
            return
        async with self.adapters.using(ref):
            async for event in self._generate(request):
                yield event

    def adapter_base(self) -> BaseShapes | None:
        """What the gateway checks uploads against: the engine's base model layers, also
        where this head serves no adapter itself (a model's separate adapter head has the
        same layers and may be asleep); None where the engine cannot tell."""
        return self.engine.adapter_base()

    async def forget_adapter(self, key: str, held: bool = False) -> ForgetReply:
        """A deleted adapter: unload it and drop its cached files (``ForgetReply``);
        ``held``: a Serve replica dropped it from the multiplexing LRU already."""
        if self.adapters is None:
            return "absent"
        return await self.adapters.forget(key, held)

    async def _generate(self, request: HeadRequest) -> AsyncIterator[HeadEvent]:
        try:
            plan = await self._plan(request)
        except GatewayError as err:
            yield HeadFailure.from_error(err)
            return
        except Exception as err:  # an engine that cannot even render the prompt
            logger.exception("prepare failed for %s", request.request_id)
            yield HeadFailure.from_error(UpstreamError(f"The model failed to start: {err}"))
            return
        prepared, samplings, ignored = plan
        yield HeadStarted(
            prompt_tokens=sum(p.num_tokens for p in prepared),
            max_tokens=max(s.max_tokens for s in samplings),
            ignored_params=ignored,
            sampling_defaults=dict(self.info.sampling_defaults) if self.info else {},
        )
        async for event in self._stream_all(request, prepared, samplings):
            yield event

    async def _plan(
        self, request: HeadRequest
    ) -> tuple[list[PreparedPrompt], list[SamplingSpec], list[str]]:
        if self.info is None:
            raise UpstreamError("The head has not finished starting.")
        supported = self.engine.supported_extra_params()
        extra = {k: v for k, v in request.sampling.extra.items() if k in supported}
        ignored = sorted(k for k in request.sampling.extra if k not in supported)
        honoured = dataclasses.replace(request.sampling, extra=extra)
        prepared: list[PreparedPrompt] = []
        samplings: list[SamplingSpec] = []
        adapter = request.adapter.key if request.adapter is not None else None
        for prompt in request.prompts:
            if adapter is not None:
                prompt = dataclasses.replace(prompt, adapter=adapter)
            ready = await self.engine.prepare(prompt, honoured)
            max_tokens = self._max_tokens_for(request, ready.num_tokens)
            prepared.append(ready)
            samplings.append(dataclasses.replace(honoured, max_tokens=max_tokens))
        return prepared, samplings, ignored

    def _max_tokens_for(self, request: HeadRequest, prompt_tokens: int) -> int:
        """docs/reference/chat.md#chat-request: prompt + max_tokens <= max_model_len; omitted =
        remaining window."""
        assert self.info is not None
        window = self.info.max_model_len
        remaining = window - prompt_tokens
        if request.max_tokens is not None:
            if prompt_tokens + request.max_tokens > window:
                raise InvalidRequestError(
                    f"This model's maximum context length is {window} tokens. You requested "
                    f"{prompt_tokens + request.max_tokens} tokens ({prompt_tokens} in the "
                    f"prompt, {request.max_tokens} for the completion). Reduce the prompt "
                    f"or {request.max_tokens_param}.",
                    code="context_length_exceeded",
                    param=request.max_tokens_param,
                )
            return request.max_tokens
        if remaining < 1:
            raise InvalidRequestError(
                f"This model's maximum context length is {window} tokens and the prompt "
                f"has {prompt_tokens}; no room is left for a completion.",
                code="context_length_exceeded",
                param=request.prompt_param,
            )
        return min(remaining, request.max_output_tokens)

    async def _stream_all(
        self,
        request: HeadRequest,
        prepared: list[PreparedPrompt],
        samplings: list[SamplingSpec],
    ) -> AsyncIterator[HeadEvent]:
        """Run every prompt, renumber choices, and sum the accounting."""
        n = request.sampling.n
        totals = GenerationDone(prompt_tokens=0, completion_tokens=0)
        streams = [
            self._offset_stream(f"{request.request_id}-{i}", spec, p, s, i * n, request.stream)
            for i, (spec, p, s) in enumerate(zip(request.prompts, prepared, samplings, strict=True))
        ]
        try:
            async for event in _merge(streams):
                if isinstance(event, GenerationDone):
                    totals.add(event)
                else:
                    yield event
        except GatewayError as err:
            yield HeadFailure.from_error(err)
            return
        except Exception as err:
            logger.exception("engine failed mid-stream for %s", request.request_id)
            yield HeadFailure.from_error(UpstreamError(f"The model stream broke: {err}"))
            return
        yield totals

    async def _offset_stream(
        self,
        request_id: str,
        spec: PromptSpec,
        prompt: PreparedPrompt,
        sampling: SamplingSpec,
        offset: int,
        stream: bool,
    ) -> AsyncIterator[TextDelta | GenerationDone]:
        events = self.engine.generate(request_id, prompt, sampling, stream=stream)
        if self.answer_invented_calls and _may_invent_calls(spec, sampling):
            events = self._answer_invented(request_id, spec, events, sampling, stream)
        async for event in events:
            if isinstance(event, TextDelta) and offset:
                event = dataclasses.replace(event, choice_index=event.choice_index + offset)
            yield event

    async def _answer_invented(
        self,
        request_id: str,
        spec: PromptSpec,
        events: AsyncIterator[TextDelta | GenerationDone],
        sampling: SamplingSpec,
        stream: bool,
    ) -> AsyncIterator[TextDelta | GenerationDone]:
        """``events``, or the turn again without tools if it opens with an invented call.

        Events before the first text or tool call (role-only or reasoning deltas) are held
        until that point decides; the tool parser itself holds back text that may become
        a call, so the first text of an invented call already names it. The abandoned
        generation is aborted (closing the engine's stream does) and not reported: the
        usage is the answer's.
        """
        held: list[TextDelta | GenerationDone] = []
        iterator = aiter(events)
        try:
            async for event in iterator:
                if not isinstance(event, TextDelta) or not (event.text or event.tool_calls):
                    held.append(event)
                    continue
                name = None if event.tool_calls else invented_call(event.text, _names(spec))
                if name is None:
                    for earlier in (*held, event):
                        yield earlier
                    async for rest in iterator:
                        yield rest
                    return
                retry = dataclasses.replace(spec, tools=None, tool_choice=None)
                ready = await self.engine.prepare(retry, sampling)
                logger.info("%s called undeclared %r: answering without tools", request_id, name)
                break
            else:
                for earlier in held:
                    yield earlier
                return
        finally:
            await _aclose(iterator)
        async for event in self.engine.generate(f"{request_id}-a", ready, sampling, stream=stream):
            yield event


async def _merge(streams: list[AsyncIterator[Any]]) -> AsyncIterator[Any]:
    """Interleave several async iterators; the first error cancels the rest."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield item
        return
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump(stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                await queue.put(item)
            await queue.put(_STREAM_END)
        except BaseException as err:  # forwarded to the consumer below
            await queue.put(err)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is _STREAM_END:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


def adapter_slots(
    engine: TextEngine,
    open_objects: Callable[[], AdapterObjects] | None,
    cache_dir: Path | None = None,
) -> AdapterSlots | None:
    """The engine's adapter slots where it serves LoRA adapters, else None.

    ``cache_dir``: where uploaded adapters' files are kept (default: the models cache's
    ``adapters`` folder)."""
    lora = engine.lora_settings()
    if lora is None:
        return None
    from deployments.local_models.resolve import resolve_model

    files = AdapterFiles(open_objects, cache_dir, resolve_path=resolve_model)
    return AdapterSlots(engine, files, max_loaded=lora.max_loras)


def _may_invent_calls(spec: PromptSpec, sampling: SamplingSpec) -> bool:
    """A chat turn where the model chooses freely among tools, one choice per prompt
    (with several, one choice's retry would redo the others')."""
    return (
        spec.kind == "chat"
        and bool(spec.tools)
        and spec.tool_choice in (None, "auto")
        and sampling.n == 1
    )


def _names(spec: PromptSpec) -> frozenset[str]:
    return declared_names(spec.tools)


async def _aclose(iterator: AsyncIterator[Any]) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


def _has_content(batch: list[HeadEvent]) -> bool:
    return any(isinstance(e, TextDelta) for e in batch)


def _env_float(name: str, given: float | None) -> float | None:
    """An experiment's override from the replica's environment, else ``given``."""
    value = os.environ.get(name)
    return float(value) if value else given


@serve.deployment(ray_actor_options={"num_cpus": 1})
class ChatHead:
    """Ray Serve replica hosting one text engine; the engine comes from a factory."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits async constructors
        self,
        model_id: str,
        backend: str,
        engine_config: dict[str, Any],
        stream_batch_ms: float = DEFAULT_INTERVAL_S * 1000,
        stream_batch_max_ms: float | None = None,
        stream_messages_per_s: float | None = None,
        open_adapter_objects: Callable[[], AdapterObjects] | None = None,
    ) -> None:
        """``open_adapter_objects`` opens the gateway's object store in this replica, for
        uploaded LoRA adapters (the builder passes it to heads with ``lora`` settings)."""
        configure_replica_logging()
        self.batch_interval_s = stream_batch_ms / 1000
        max_ms = _env_float("GATEWAY_STREAM_BATCH_MAX_MS", stream_batch_max_ms)
        rate = _env_float("GATEWAY_STREAM_MESSAGES_PER_S", stream_messages_per_s)
        self.load = StreamLoad(
            self.batch_interval_s,
            DEFAULT_MAX_INTERVAL_S if max_ms is None else max_ms / 1000,
            DEFAULT_MESSAGES_PER_S if rate is None else rate,
        )
        # Imported here: the gateway process imports this module for the
        # handle types and must not pay for (or need) vLLM itself.
        from deployments import registry

        self.model_id = model_id
        engine = registry.build_engine("chat", backend, engine_config)
        self.core = ChatHeadCore(engine, adapter_slots(engine, open_adapter_objects))
        if self.core.adapters is not None:
            self._multiplex_adapters(self.core.adapters)
        info = await self.core.start()
        logger.info("head %s ready (max_model_len=%d)", model_id, info.max_model_len)

    async def generate(self, request: HeadRequest) -> AsyncIterator[list[HeadEvent]]:
        """The core's events in batches: one handle message per batch, not per token."""
        events = self.core.generate(request)
        if not self.batch_interval_s:
            async for event in events:
                yield [event]
            return
        load = self.load
        streaming = False
        try:
            async for batch in coalesce(events, load.window if request.stream else None):
                if request.stream and not streaming and _has_content(batch):
                    streaming = True
                    load.streaming += 1
                yield batch
        finally:
            if streaming:
                load.streaming -= 1

    async def info(self) -> EngineInfo:
        assert self.core.info is not None
        return self.core.info

    def _multiplex_adapters(self, slots: AdapterSlots) -> None:
        """Serve's model multiplexing keeps this replica's adapters (LRU of ``max_loras``)
        and tells the router which replica holds which, so a request for an adapter goes
        where it is loaded. The multiplexed model id is the adapter's ``key``."""
        refs: dict[str, AdapterRef] = {}
        loop = asyncio.get_running_loop()

        async def load_adapter(key: str) -> MultiplexedAdapter:
            ref = refs[key]
            await slots.load(ref)
            return MultiplexedAdapter(slots, ref.key, loop)

        multiplexed = serve.multiplexed(max_num_models_per_replica=slots.max_loaded or 1)(
            load_adapter
        )
        slots.max_loaded = None  # the multiplexer's LRU decides

        async def ensure(ref: AdapterRef) -> None:
            refs[ref.key] = ref
            await multiplexed(ref.key)

        self._multiplex_owner = load_adapter  # where Serve keeps the LRU (its wrapper)
        self.core.ensure_adapter = ensure

    async def forget_adapter(self, key: str) -> ForgetReply:
        """The gateway deleted adapter ``key``: out of Serve's LRU (the router stops
        sending its requests here), unloaded, its files dropped (``ForgetReply``)."""
        owner = getattr(self, "_multiplex_owner", None)
        held = owner is not None and await drop_multiplexed(owner, key)
        return await self.core.forget_adapter(key, held)

    async def adapter_base(self) -> BaseShapes | None:
        """The base model's layers as adapters see them (the gateway checks uploads)."""
        return self.core.adapter_base()

    async def loaded_adapters(self) -> list[str]:
        """The keys of the adapters this replica holds, least recently used first
        (operators, tests)."""
        return self.core.adapters.loaded if self.core.adapters is not None else []

    async def wake(self) -> None:
        """Nothing to do: a call waiting for a replica is what scales a sleeping head up."""

    async def check_health(self) -> None:
        await self.core.engine.check_health()

    async def __del__(self) -> None:
        await self.core.engine.shutdown()
