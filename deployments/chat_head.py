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
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from deployments.engines.base import EngineInfo, PreparedPrompt, TextEngine
from deployments.replica_logging import configure_replica_logging
from deployments.stream_batching import (
    DEFAULT_INTERVAL_S,
    DEFAULT_MAX_INTERVAL_S,
    DEFAULT_MESSAGES_PER_S,
    StreamLoad,
    coalesce,
)
from serve_app.contract.errors import GatewayError, HeadFailure, InvalidRequestError, UpstreamError
from serve_app.contract.text import (
    GenerationDone,
    HeadEvent,
    HeadRequest,
    HeadStarted,
    SamplingSpec,
    TextDelta,
)

logger = logging.getLogger(__name__)

_STREAM_END = object()


class ChatHeadCore:
    """Guardrails and stream framing around one ``TextEngine``."""

    def __init__(self, engine: TextEngine) -> None:
        self.engine = engine
        self.info: EngineInfo | None = None

    async def start(self) -> EngineInfo:
        self.info = await self.engine.start()
        return self.info

    async def generate(self, request: HeadRequest) -> AsyncIterator[HeadEvent]:
        """Yield ``HeadStarted`` then deltas then ``GenerationDone``; failures as events."""
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
        for prompt in request.prompts:
            ready = await self.engine.prepare(prompt, honoured)
            max_tokens = self._max_tokens_for(request, ready.num_tokens)
            prepared.append(ready)
            samplings.append(dataclasses.replace(honoured, max_tokens=max_tokens))
        return prepared, samplings, ignored

    def _max_tokens_for(self, request: HeadRequest, prompt_tokens: int) -> int:
        """Spec 4.1: prompt + max_tokens <= max_model_len; omitted = remaining window."""
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
            self._offset_stream(f"{request.request_id}-{i}", p, s, i * n, request.stream)
            for i, (p, s) in enumerate(zip(prepared, samplings, strict=True))
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
        prompt: PreparedPrompt,
        sampling: SamplingSpec,
        offset: int,
        stream: bool,
    ) -> AsyncIterator[TextDelta | GenerationDone]:
        async for event in self.engine.generate(request_id, prompt, sampling, stream=stream):
            if isinstance(event, TextDelta) and offset:
                event = dataclasses.replace(event, choice_index=event.choice_index + offset)
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
    ) -> None:
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
        from deployments.engines.factory import build_text_engine

        self.model_id = model_id
        self.core = ChatHeadCore(build_text_engine(backend, engine_config))
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

    async def check_health(self) -> None:
        await self.core.engine.check_health()

    async def __del__(self) -> None:
        await self.core.engine.shutdown()
