"""How the gateway reaches a head: over a Ray DeploymentHandle, or in-process in tests.

One Ray client, ``RayHeadClient``, serves every head kind: chat streams
(``stream``), speech (``synthesize``), transcription (``transcribe``), detect and
parse (``detect``, ``parse``), embeddings and scores (``embed``, ``score``), the
video worker's poke (``wake``), and the calls
dedicated routing makes on an endpoint's own Serve app. Ray's failures are mapped
in one place, ``map_ray_error``, so no service or route sees a Ray exception type:

- backpressure (the head's queue is full): 503 ``model_unavailable`` with ``Retry-After``;
- a lost replica (actor died or unreachable): 503 ``model_unavailable``;
- anything else a head raised, or Ray itself: 502 ``upstream_error``;
- a ``GatewayError`` is already an answer and passes as it is (heads report their
  errors as ``HeadFailure`` values; one raised across the handle keeps its fields).

A call the gateway stops waiting for (a timeout, a client gone, a stream closed
before its end) is cancelled on the head too, so the head's work stops with it.

Heads answer with plain values (head events, a result or a ``HeadFailure``), so the
in-process clients (``Local*``) return the same things by calling a head's core
directly, for unit tests and benchmarks. They take the core by its shape (the
``*Core`` protocols below), so this module imports nothing of ``deployments``: the
composition root or a test builds the core.

A chat model served by an external provider is reached beside these, by
``serve_app.heads.external.ExternalHeadClient``: the same ``stream`` of head events,
over the provider's HTTP API instead of a handle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from serve_app.catalog.config import CatalogModel
from serve_app.contract.adapters import BaseShapes, ForgetReply
from serve_app.contract.audio import (
    SpeechHeadReply,
    SpeechHeadRequest,
    TranscriptionHeadReply,
    TranscriptionHeadRequest,
)
from serve_app.contract.chat import HeadEvent, HeadRequest
from serve_app.contract.documents import (
    DetectHeadReply,
    DetectHeadRequest,
    ParseHeadReply,
    ParseHeadRequest,
)
from serve_app.contract.embeddings import (
    ONE_ITEM_STREAM,
    EmbedHeadReply,
    EmbedHeadRequest,
    ScoreHeadReply,
    ScoreHeadRequest,
)
from serve_app.contract.errors import HeadFailure
from serve_app.contract.head_kinds import head_kind
from serve_app.protocol.errors import GatewayError, ModelUnavailableError, UpstreamError

logger = logging.getLogger(__name__)

WAKE_TIMEOUT_S = 10.0
"""How long a video head's poke may take before the gateway stops waiting for it."""


# ---- what the services call ---------------------------------------------------------
class HeadClient(Protocol):
    """A chat head: a stream of head events for one request."""

    def stream(self, request: HeadRequest) -> AsyncIterator[HeadEvent]: ...


class SpeechClient(Protocol):
    async def synthesize(self, request: SpeechHeadRequest) -> SpeechHeadReply: ...


class TranscriptionClient(Protocol):
    async def transcribe(self, request: TranscriptionHeadRequest) -> TranscriptionHeadReply: ...


class DocumentClient(Protocol):
    async def detect(self, request: DetectHeadRequest) -> DetectHeadReply: ...

    async def parse(self, request: ParseHeadRequest) -> ParseHeadReply: ...


class PoolingClient(Protocol):
    """A pooling head: embeddings and scores."""

    async def embed(self, request: EmbedHeadRequest) -> EmbedHeadReply: ...

    async def score(self, request: ScoreHeadRequest) -> ScoreHeadReply: ...


class VideoHeadClient(Protocol):
    """A video head's worker, poked when a job was queued.

    The poke is only a hint ("a job was queued, look now"): the job is already in the
    database and the worker also polls, so a lost or failed poke delays a job by at
    most one poll interval. Hence ``wake`` never raises.
    """

    async def wake(self) -> None: ...


# ---- over Ray -------------------------------------------------------------------------
def map_ray_error(model_id: str, err: Exception) -> GatewayError:
    """Ray's failure types -> the API's 503 (retryable) or 502; the one mapping."""
    from ray import exceptions as ray_exceptions
    from ray.serve import exceptions as serve_exceptions

    if isinstance(err, GatewayError):
        return err  # already the API's answer (Ray re-raises a head's with its fields)
    if isinstance(err, serve_exceptions.BackPressureError):
        return ModelUnavailableError(
            f"Model '{model_id}' is at capacity; retry shortly.", headers={"Retry-After": "1"}
        )
    if isinstance(err, ray_exceptions.ActorDiedError | ray_exceptions.ActorUnavailableError):
        logger.warning("head %s replica lost: %s", model_id, err)
        return ModelUnavailableError(f"Model '{model_id}' lost its replica; retry shortly.")
    logger.error("head %s failed: %s", model_id, err)
    return UpstreamError(f"Model '{model_id}' failed.")


FORGET_MAX_CALLS = 32
"""Bound of the ``forget_adapter`` calls one deletion makes (replicas holding it, plus
the answers that end the loop)."""
FORGET_SETTLE_S = 0.3
"""Wait after a replica dropped an adapter: it pushes its model ids within 0.1 s, Serve's
controller passes them on to the routers in its next loop."""
FORGET_QUIET_CALLS = 3
"""Consecutive ``forgotten`` answers (each after a longer wait) that end the loop."""


class RayHeadClient:
    """Any head deployment (or a dedicated endpoint's) through its DeploymentHandle.

    Chat streams use Serve's gRPC transport (``_by_reference=False``), not Ray object
    references: a streamed item is then one message on a gRPC stream instead of a Ray
    object the caller is told about, fetches and frees. Measured together with the
    proxy's gRPC transport (``gateway run`` sets ``RAY_SERVE_PROXY_USE_GRPC``), proxy +
    gateway + head CPU per token under 32 streams fell by about a third
    (bench/RESULTS.md). A broken gRPC stream is a 502 like any other failure.

    Unary calls go through a second handle to the same deployment whose router runs on
    the calling event loop (``_run_router_in_separate_loop=False``) rather than on
    Serve's router thread: a call then crosses no thread on its way out or back. Only
    the loop that first called uses it (a Serve router is bound to one loop); a call
    from any other loop takes the shared handle. Small pooling calls also travel over
    gRPC (``inline``; see ``pooling_fits_inline`` for why only small ones), read as a
    stream of one reply (``ONE_ITEM_STREAM``): a unary gRPC reply reaches the caller only
    with the call's final status, a streamed item as soon as it arrives.
    """

    def __init__(self, model_id: str, handle: Any) -> None:
        self.model_id = model_id
        self._handle = handle
        self._streaming: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop that called first: the one ``_bound``'s router runs on."""
        self._bound: Any = None
        self._inline: dict[bool, Any] = {}
        """On the owning loop or not -> that loop's streaming handle on the gRPC transport."""
        self._ending: set[asyncio.Task[None]] = set()
        """Background reads of one-item streams' ends (a task needs a reference)."""
        self.forget_max_calls = FORGET_MAX_CALLS
        self.forget_settle_s = FORGET_SETTLE_S

    async def stream(self, request: HeadRequest) -> AsyncIterator[HeadEvent]:
        """A chat head's ``generate``: its events, unpacked from the batches heads send."""
        if self._streaming is None:
            self._streaming = self._handle.options(stream=True, _by_reference=False)
        streaming = self._streaming
        if request.adapter is not None:
            # Serve's model multiplexing: to a replica that holds the adapter, else any
            # (docs/reference/adapters.md#serving).
            streaming = streaming.options(multiplexed_model_id=request.adapter.key)
        response = streaming.generate.remote(request)
        try:
            async for item in response:
                # Heads send batches (deployments.stream_batching); a single event
                # is accepted too, from heads that do not batch.
                if isinstance(item, list):
                    for event in item:
                        yield event
                else:
                    yield item
        except BaseException as err:
            self._give_up(response, err)
            raise

    async def call(self, method: str, *args: Any, inline: bool = False) -> Any:
        """One unary call of ``method`` on the head: its plain reply. ``inline``: over
        Serve's gRPC transport, read as a one-item stream (the caller vouches the request
        and reply are small and the head streams ``method``: ``ONE_ITEM_STREAM``)."""
        if inline:
            return await self._call_streamed(method, *args)
        response = getattr(self._unary_handle(False), method).remote(*args)
        try:
            return await response
        except BaseException as err:
            self._give_up(response, err)
            raise

    async def _call_streamed(self, method: str, *args: Any) -> Any:
        """The reply is returned as soon as it arrives; the stream's end (already on its
        way) is read in the background, so Serve's router counts the call finished."""
        stream = getattr(self._unary_handle(True), ONE_ITEM_STREAM).remote(method, *args)
        items = stream.__aiter__()
        try:
            reply = await items.__anext__()
        except StopAsyncIteration:
            raise UpstreamError(f"Model '{self.model_id}' answered nothing.") from None
        except BaseException as err:
            self._give_up(stream, err)
            raise
        task = asyncio.get_running_loop().create_task(self._read_end(items))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)
        return reply

    async def _read_end(self, items: AsyncIterator[Any]) -> None:
        try:
            async for _ in items:
                logger.warning("head %s streamed a second reply; dropped", self.model_id)
        except Exception as err:  # the reply was delivered; only the stream's end broke
            logger.debug("head %s: end of a one-item stream: %s", self.model_id, err)

    def _unary_handle(self, inline: bool) -> Any:
        """One loop-bound handle (one router) per client; ``inline`` takes its streaming
        view on the gRPC transport (``_call_streamed``), else the handle itself."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop, self._bound = loop, _loop_bound(self._handle)
        owned = loop is self._loop
        base = self._bound if owned else self._handle
        if not inline:
            return base
        handle = self._inline.get(owned)
        if handle is None:
            handle = self._inline[owned] = base.options(stream=True, _by_reference=False)
        return handle

    def _give_up(self, response: Any, err: BaseException) -> None:
        """Cancel the head's work; raise ``err`` mapped when it is a failure (the caller
        re-raises a cancellation or a closed stream as it is)."""
        response.cancel()  # a timeout, a client gone, a stream closed: stop the head too
        if isinstance(err, Exception):
            raise map_ray_error(self.model_id, err) from None

    async def forget_adapter(self, key: str) -> bool:
        """A deleted adapter, unloaded on every replica that holds it; whether any did.

        Each call goes where Serve's router believes the adapter is loaded
        (``multiplexed_model_id``); the replica drops it from its multiplexing LRU, so
        once the router hears of it the next call reaches the next holder. The loop
        ends at the first ``absent`` (the router knew no holder and picked a replica
        that never had it), after ``FORGET_QUIET_CALLS`` ``forgotten`` answers in a row
        (its view still stale, or its fallback picking a replica that dropped it), or
        after ``forget_max_calls`` (docs/reference/adapters.md#deleting).
        """
        held, quiet = False, 0
        for _ in range(self.forget_max_calls):
            reply = await self._forget_once(key)
            if reply == "absent":
                return held
            if reply == "unloaded":
                held, quiet = True, 0
            else:
                quiet += 1
                if quiet >= FORGET_QUIET_CALLS:
                    return held
            await asyncio.sleep(self.forget_settle_s * 2 ** max(0, quiet - 1))
        logger.warning(
            "head %s: adapter %s may still be held after %d forget calls",
            self.model_id,
            key,
            self.forget_max_calls,
        )
        return held

    async def adapter_base(self) -> BaseShapes | None:
        """A chat head's base model as adapters see it (uploads are checked against it)."""
        reply: BaseShapes | None = await self.call("adapter_base")
        return reply

    async def _forget_once(self, key: str) -> ForgetReply:
        response = self._handle.options(multiplexed_model_id=key).forget_adapter.remote(key)
        try:
            reply = await response
        except BaseException as err:
            self._give_up(response, err)
            raise
        if isinstance(reply, bool):  # a head from before replies were named
            return "unloaded" if reply else "absent"
        return reply

    async def synthesize(self, request: SpeechHeadRequest) -> SpeechHeadReply:
        reply: SpeechHeadReply = await self.call("synthesize", request)
        return reply

    async def transcribe(self, request: TranscriptionHeadRequest) -> TranscriptionHeadReply:
        reply: TranscriptionHeadReply = await self.call("transcribe", request)
        return reply

    async def detect(self, request: DetectHeadRequest) -> DetectHeadReply:
        reply: DetectHeadReply = await self.call("detect", request)
        return reply

    async def parse(self, request: ParseHeadRequest) -> ParseHeadReply:
        reply: ParseHeadReply = await self.call("parse", request)
        return reply

    async def embed(self, request: EmbedHeadRequest) -> EmbedHeadReply:
        inline = pooling_fits_inline(request.texts, request.token_ids)
        reply: EmbedHeadReply = await self.call("embed", request, inline=inline)
        return reply

    async def score(self, request: ScoreHeadRequest) -> ScoreHeadReply:
        texts = [*request.queries, *request.documents]
        inline = _fits(texts, None, max_inputs=None)  # a score answers one float per pair
        reply: ScoreHeadReply = await self.call("score", request, inline=inline)
        return reply

    async def wake(self) -> None:
        """Poke a video head's worker; never raises (see ``VideoHeadClient``)."""
        try:
            await asyncio.wait_for(self.call("wake"), WAKE_TIMEOUT_S)
        except Exception as err:  # the worker's poll finds the job anyway
            logger.info("video head %s not poked (%s); it will poll", self.model_id, err)


INLINE_MAX_INPUTS = 64
"""Inputs of an embeddings call that may travel over gRPC: 64 vectors of even 8,192
float32 dimensions answer 2 MiB, half of Serve's default gRPC message cap for replicas
(``RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH``, 4 MiB)."""
INLINE_MAX_CHARS = 256 * 1024
"""Characters of all texts of a call that may travel over gRPC (at most 1 MiB of UTF-8)."""
INLINE_MAX_TOKEN_IDS = 128 * 1024
"""Token ids of a call that may travel over gRPC (at most 5 bytes each, pickled)."""


def pooling_fits_inline(texts: list[str] | None, token_ids: list[list[int]] | None) -> bool:
    """Whether an embeddings call is small enough for Serve's gRPC transport.

    Measured at 1 request of 16 inputs in flight (bench/RESULTS.md, "2026-11-27 08:36-09:40"):
    gRPC instead of Ray object references saved ~2 ms of the ~7.6 ms the handle's
    round trip took, and the loop-bound router another ~1 ms. Serve's replicas refuse a
    gRPC message above 4 MiB, and 2,048 inputs of a 4,096-dimension model answer 33 MiB,
    so large calls keep the object references (the per-call cost matters less there).
    """
    return _fits(texts, token_ids, INLINE_MAX_INPUTS)


def _fits(
    texts: list[str] | None, token_ids: list[list[int]] | None, max_inputs: int | None
) -> bool:
    """``max_inputs`` None: no bound on the count of inputs."""
    count = len(texts if texts is not None else token_ids or [])
    if max_inputs is not None and count > max_inputs:
        return False
    if texts is not None and sum(len(t) for t in texts) > INLINE_MAX_CHARS:
        return False
    return token_ids is None or sum(len(ids) for ids in token_ids) <= INLINE_MAX_TOKEN_IDS


def _loop_bound(handle: Any) -> Any:
    """A new handle to ``handle``'s deployment whose router runs on the calling loop;
    ``handle`` itself where it is not a Serve handle (tests' stand-ins)."""
    from ray.serve.handle import DeploymentHandle

    if not isinstance(handle, DeploymentHandle):
        return handle
    bound: Any = DeploymentHandle(handle.deployment_id.name, handle.deployment_id.app_name)
    bound._init(_run_router_in_separate_loop=False)
    return bound


@dataclass
class HeadClients:
    """The clients of every bound head, by kind (what the services are built with); each
    head kind's ``clients`` (``serve_app.contract.head_kinds``) names its field."""

    chat: dict[str, HeadClient] = field(default_factory=dict)
    speech: dict[str, SpeechClient] = field(default_factory=dict)
    transcription: dict[str, TranscriptionClient] = field(default_factory=dict)
    documents: dict[str, DocumentClient] = field(default_factory=dict)
    video: dict[str, VideoHeadClient] = field(default_factory=dict)
    pooling: dict[str, PoolingClient] = field(default_factory=dict)


def ray_head_clients(catalog: Iterable[CatalogModel], handles: Mapping[str, Any]) -> HeadClients:
    """A ``RayHeadClient`` for each catalog model bound to a head, filed by its kind."""
    clients = HeadClients()
    for model in catalog:
        if model.id not in handles:
            continue
        filed: dict[str, Any] = getattr(clients, head_kind(model.head).clients)
        filed[model.id] = RayHeadClient(model.id, handles[model.id])
        adapters = model.adapter_head_id  # its adapters' own head, requests' ``head_id``
        if model.head == "chat" and adapters is not None and adapters in handles:
            clients.chat[adapters] = RayHeadClient(model.id, handles[adapters])
    return clients


# ---- in-process (tests, benchmarks) ----------------------------------------------------
class ChatCore(Protocol):
    """``deployments.chat.head.ChatHeadCore``."""

    def generate(self, request: HeadRequest) -> AsyncIterator[HeadEvent]: ...

    async def forget_adapter(self, key: str) -> ForgetReply: ...

    def adapter_base(self) -> BaseShapes | None: ...


class SpeechCore(Protocol):
    """``deployments.audio.speech_head.SpeechHeadCore``."""

    async def synthesize(self, request: SpeechHeadRequest) -> SpeechHeadReply: ...


class TranscriptionCore(Protocol):
    """``deployments.audio.transcription_head.TranscriptionHeadCore``."""

    async def transcribe(self, request: TranscriptionHeadRequest) -> TranscriptionHeadReply: ...


@runtime_checkable
class DetectCore(Protocol):
    """``deployments.documents.head.DetectHeadCore``."""

    async def detect(self, request: DetectHeadRequest) -> DetectHeadReply: ...


@runtime_checkable
class ParseCore(Protocol):
    """``deployments.documents.head.ParseHeadCore``."""

    async def parse(self, request: ParseHeadRequest) -> ParseHeadReply: ...


class PoolingCore(Protocol):
    """``deployments.embeddings.head.PoolingHeadCore``."""

    async def embed(self, request: EmbedHeadRequest) -> EmbedHeadReply: ...

    async def score(self, request: ScoreHeadRequest) -> ScoreHeadReply: ...


class VideoWorker(Protocol):
    """A video head's worker in this process (``deployments.video.head.VideoHeadCore``)."""

    def wake(self) -> None: ...


class LocalHeadClient:
    """Calls a chat head's core in this process."""

    def __init__(self, core: ChatCore) -> None:
        self.core = core

    def stream(self, request: HeadRequest) -> AsyncIterator[HeadEvent]:
        return self.core.generate(request)

    async def forget_adapter(self, key: str) -> bool:
        return await self.core.forget_adapter(key) == "unloaded"

    async def adapter_base(self) -> BaseShapes | None:
        return self.core.adapter_base()


class LocalSpeechClient:
    """Calls a speech head's core in this process."""

    def __init__(self, core: SpeechCore) -> None:
        self.core = core

    async def synthesize(self, request: SpeechHeadRequest) -> SpeechHeadReply:
        return await self.core.synthesize(request)


class LocalTranscriptionClient:
    """Calls a transcription head's core in this process."""

    def __init__(self, core: TranscriptionCore) -> None:
        self.core = core

    async def transcribe(self, request: TranscriptionHeadRequest) -> TranscriptionHeadReply:
        return await self.core.transcribe(request)


def _wrong_kind(kind: str) -> HeadFailure:
    return HeadFailure(502, "upstream_error", f"This head does not {kind}.", "upstream_error")


class LocalDocumentClient:
    """Calls a detect or parse head's core in this process."""

    def __init__(self, core: DetectCore | ParseCore) -> None:
        self.core = core

    async def detect(self, request: DetectHeadRequest) -> DetectHeadReply:
        if not isinstance(self.core, DetectCore):
            return _wrong_kind("detect")
        return await self.core.detect(request)

    async def parse(self, request: ParseHeadRequest) -> ParseHeadReply:
        if not isinstance(self.core, ParseCore):
            return _wrong_kind("parse")
        return await self.core.parse(request)


class LocalPoolingClient:
    """Calls a pooling head's core in this process."""

    def __init__(self, core: PoolingCore) -> None:
        self.core = core

    async def embed(self, request: EmbedHeadRequest) -> EmbedHeadReply:
        return await self.core.embed(request)

    async def score(self, request: ScoreHeadRequest) -> ScoreHeadReply:
        return await self.core.score(request)


class LocalVideoClient:
    """Pokes a video head's worker in this process."""

    def __init__(self, core: VideoWorker) -> None:
        self.core = core

    async def wake(self) -> None:
        self.core.wake()
