"""The one head client: every head kind maps Ray's failures the same way and cancels
the head's work when the gateway stops waiting.

The handle is a stand-in with Serve's surface (``options(stream=True)``,
``handle.<method>.remote(...)`` giving an awaitable or async-iterable response with
``cancel()``); the failures are Ray's own exception types.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from ray import exceptions as ray_exceptions
from ray.serve import exceptions as serve_exceptions

from serve_app.catalog.config import CatalogModel
from serve_app.contract.audio import SpeechHeadRequest, TranscriptionHeadRequest
from serve_app.contract.chat import (
    GenerationDone,
    HeadRequest,
    HeadStarted,
    PromptSpec,
    SamplingSpec,
    TextDelta,
)
from serve_app.contract.documents import DetectHeadRequest, ParseHeadRequest
from serve_app.contract.embeddings import EmbedHeadRequest, ScoreHeadRequest
from serve_app.heads import client as head_client
from serve_app.heads.client import RayHeadClient, ray_head_clients
from serve_app.protocol.errors import GatewayError, InvalidRequestError

HANG = object()
LONG = head_client.INLINE_MAX_CHARS


class FakeResponse:
    """A ``DeploymentResponse`` or ``DeploymentResponseGenerator`` stand-in."""

    def __init__(
        self, outcome: Any, by_reference: bool = True, streaming: bool = False, args: Any = ()
    ) -> None:
        self.outcome = outcome
        self.cancelled = False
        self.by_reference = by_reference
        """The transport the call went over: Ray object references, or gRPC (False)."""
        self.streaming = streaming
        self.args = args
        self.end = asyncio.Event()
        """A one-item stream (a list outcome of one item) ends only once this is set."""
        self.end.set()
        self.ended = False

    def cancel(self) -> None:
        self.cancelled = True

    async def _settle(self) -> Any:
        if self.outcome is HANG:
            await asyncio.sleep(60)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def __await__(self) -> Any:
        return self._settle().__await__()

    async def __aiter__(self) -> AsyncIterator[Any]:
        items = self.outcome if isinstance(self.outcome, list) else [await self._settle()]
        for item in items:
            if isinstance(item, BaseException):
                raise item
            yield item
        await self.end.wait()
        self.ended = True


class FakeHandle:
    """Each ``handle.<method>.remote(...)`` answers ``outcome``; ``responses`` keeps them."""

    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.streaming = False
        self.by_reference = True
        self.sends_by_reference = True
        """The transport of this handle's own calls (``by_reference``: the last options)."""
        self.responses: list[tuple[str, FakeResponse]] = []

    def options(self, *, stream: bool = False, _by_reference: bool = True) -> FakeHandle:
        """A view with these options sharing ``responses``; the last options are also
        kept on this handle."""
        self.streaming = stream
        self.by_reference = _by_reference
        view = FakeHandle(self.outcome)
        view.streaming, view.by_reference, view.responses = stream, _by_reference, self.responses
        view.sends_by_reference = _by_reference
        return view

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Method:
            def remote(self, *args: Any) -> FakeResponse:
                response = FakeResponse(
                    handle.outcome, handle.sends_by_reference, handle.streaming, args
                )
                handle.responses.append((method, response))
                return response

        return Method()


async def _read_stream(client: RayHeadClient) -> list[Any]:
    return [event async for event in client.stream(_chat_request())]


def _chat_request() -> HeadRequest:
    return HeadRequest(
        request_id="req-1",
        prompts=[PromptSpec(kind="chat", messages=[{"role": "user", "content": "hi"}])],
        sampling=SamplingSpec(max_tokens=4),
        max_tokens=4,
        max_tokens_param="max_tokens",
        max_output_tokens=8,
    )


KINDS: dict[str, Callable[[RayHeadClient], Awaitable[Any]]] = {
    "generate": _read_stream,
    "synthesize": lambda c: c.synthesize(SpeechHeadRequest("r", text="hi", voice="alloy")),
    "transcribe": lambda c: c.transcribe(TranscriptionHeadRequest("r", b"RIFF", "wav")),
    "detect": lambda c: c.detect(DetectHeadRequest("r", image=b"png")),
    "parse": lambda c: c.parse(ParseHeadRequest("r", image=b"png", max_new_tokens=8)),
    "embed": lambda c: c.embed(EmbedHeadRequest("r", texts=["a short text"])),
}

FAILURES = {
    "backpressure": (
        serve_exceptions.BackPressureError(num_queued_requests=9, max_queued_requests=8),
        503,
        "model_unavailable",
        {"Retry-After": "1"},
    ),
    "actor died": (ray_exceptions.ActorDiedError(), 503, "model_unavailable", {}),
    "actor unavailable": (
        ray_exceptions.ActorUnavailableError("node lost", None),
        503,
        "model_unavailable",
        {},
    ),
    "head raised": (
        ray_exceptions.RayTaskError("generate", "Traceback ...", ValueError("boom")),
        502,
        "upstream_error",
        {},
    ),
    "other": (RuntimeError("handle broke"), 502, "upstream_error", {}),
    "grpc stream broke": (
        grpc.aio.AioRpcError(
            grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), "stream reset"
        ),
        502,
        "upstream_error",
        {},
    ),
}


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("kind", KINDS)
async def test_every_head_kind_maps_a_ray_failure_the_same_way(kind: str, failure: str) -> None:
    error, status, code, headers = FAILURES[failure]
    handle = FakeHandle(error)
    with pytest.raises(GatewayError) as caught:
        await KINDS[kind](RayHeadClient("m-1", handle))
    assert (caught.value.status_code, caught.value.code, caught.value.headers) == (
        status,
        code,
        headers,
    )
    assert "m-1" in caught.value.message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    [(method, response)] = handle.responses
    assert response.cancelled
    streamed = ("answer_streamed", "embed")  # a small pooling call: the head's one-item stream
    assert (method, response.args[0]) == streamed if kind == "embed" else method == kind


async def test_a_gateway_error_raised_across_the_handle_keeps_its_fields() -> None:
    cause = InvalidRequestError("bad voice", param="voice")
    raised = ray_exceptions.RayTaskError("synthesize", "tb", cause).as_instanceof_cause()
    with pytest.raises(InvalidRequestError) as caught:
        await KINDS["synthesize"](RayHeadClient("tts", FakeHandle(raised)))
    assert (caught.value.status_code, caught.value.param) == (400, "voice")


async def test_a_stream_unpacks_batches_and_a_finished_call_is_not_cancelled() -> None:
    started = HeadStarted(prompt_tokens=3, max_tokens=4)
    delta = TextDelta(choice_index=0, text="hi", completion_tokens=1)
    done = GenerationDone(prompt_tokens=3, completion_tokens=1)
    handle = FakeHandle([[started], [delta, done]])
    assert await _read_stream(RayHeadClient("chat", handle)) == [started, delta, done]
    assert handle.streaming
    assert not handle.by_reference  # Serve's gRPC transport, not Ray object references
    [(_, response)] = handle.responses
    assert not response.cancelled


async def test_a_stream_closed_before_its_end_cancels_the_head_call() -> None:
    started = HeadStarted(prompt_tokens=3, max_tokens=4)
    handle = FakeHandle([started, TextDelta(choice_index=0, text="x", completion_tokens=1)])
    stream = RayHeadClient("chat", handle).stream(_chat_request())
    assert await anext(stream) == started
    await stream.aclose()  # a 429 at admission, a client gone
    [(_, response)] = handle.responses
    assert response.cancelled


@pytest.mark.parametrize("kind", ["transcribe", "embed"])  # unary; a one-item stream
async def test_a_call_the_gateway_stops_waiting_for_is_cancelled_on_the_head(kind: str) -> None:
    handle = FakeHandle(HANG)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(KINDS[kind](RayHeadClient("m", handle)), 0.05)
    [(_, response)] = handle.responses
    assert response.cancelled


@pytest.mark.parametrize(
    ("request_", "inline"),
    [
        (EmbedHeadRequest("e", texts=["a short text"] * 16), True),
        (EmbedHeadRequest("e", token_ids=[[1, 2, 3]] * 64), True),
        (EmbedHeadRequest("e", texts=["x"] * (head_client.INLINE_MAX_INPUTS + 1)), False),
        (EmbedHeadRequest("e", texts=["x" * (head_client.INLINE_MAX_CHARS + 1)]), False),
        (EmbedHeadRequest("e", token_ids=[[7] * (head_client.INLINE_MAX_TOKEN_IDS + 1)]), False),
        (ScoreHeadRequest("s", queries=["q"], documents=["d"] * 2048), True),
        (
            ScoreHeadRequest("s", queries=["q" * head_client.INLINE_MAX_CHARS], documents=["d"]),
            False,
        ),
    ],
)
async def test_small_pooling_calls_go_over_grpc_and_large_ones_by_reference(
    request_: EmbedHeadRequest | ScoreHeadRequest, inline: bool
) -> None:
    """Serve's replicas refuse gRPC messages above 4 MiB: a large call keeps Ray's object
    references, where no cap applies."""
    handle = FakeHandle(None)
    client = RayHeadClient("emb", handle)
    if isinstance(request_, EmbedHeadRequest):
        await client.embed(request_)
    else:
        await client.score(request_)
    [(method, response)] = handle.responses
    called = "embed" if isinstance(request_, EmbedHeadRequest) else "score"
    if inline:  # read as the head's one-item stream of that method's reply
        assert (method, response.args[0], response.streaming) == ("answer_streamed", called, True)
    else:
        assert (method, response.streaming) == (called, False)
    assert response.by_reference is not inline


async def test_a_one_item_stream_answers_before_its_end_and_the_end_is_read_after() -> None:
    """The reply goes back to the caller as soon as it arrives; the stream's end is read in
    the background (Serve's router counts the call finished then), never cancelled."""
    reply = object()
    handle = FakeHandle([reply])
    client = RayHeadClient("emb", handle)
    call = asyncio.ensure_future(client.embed(EmbedHeadRequest("e", texts=["a"])))
    await asyncio.sleep(0)
    [(_, response)] = handle.responses
    response.end.clear()  # the stream stays open after its one item
    assert await asyncio.wait_for(call, 1) is reply
    assert not response.ended
    response.end.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert response.ended and not response.cancelled


async def test_a_one_item_stream_that_ends_without_a_reply_is_a_502() -> None:
    client = RayHeadClient("emb", FakeHandle([]))
    with pytest.raises(GatewayError) as caught:
        await client.embed(EmbedHeadRequest("e", texts=["a"]))
    assert (caught.value.status_code, caught.value.code) == (502, "upstream_error")


def test_unary_calls_use_a_loop_bound_handle_on_the_first_loop_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Serve router bound to one event loop cannot serve another: a call from a
    second loop goes through the shared handle (whose router has its own thread)."""
    shared, bound = FakeHandle("shared"), FakeHandle("bound")
    made: list[Any] = []

    def loop_bound(handle: Any) -> FakeHandle:
        made.append(handle)
        return bound

    monkeypatch.setattr(head_client, "_loop_bound", loop_bound)
    client = RayHeadClient("stt", shared)
    request = TranscriptionHeadRequest("r", b"RIFF", "wav")

    async def twice() -> list[Any]:
        return [await client.transcribe(request), await client.transcribe(request)]

    assert asyncio.run(twice()) == ["bound", "bound"]
    assert made == [shared]  # one loop-bound handle, made once
    assert asyncio.run(twice()) == ["shared", "shared"]  # another loop
    assert len(bound.responses) == 2 and len(shared.responses) == 2


async def test_both_transports_on_the_owning_loop_share_one_loop_bound_handle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A small pooling call (gRPC) and a large one (object references) differ only in an
    option of the one loop-bound handle: the gateway holds one extra router per head."""
    shared, bound = FakeHandle("shared"), FakeHandle(None)
    made: list[Any] = []
    monkeypatch.setattr(head_client, "_loop_bound", lambda h: made.append(h) or bound)
    client = RayHeadClient("emb", shared)
    await client.embed(EmbedHeadRequest("small", texts=["x"]))
    await client.embed(EmbedHeadRequest("large", texts=["x"] * 65))
    await client.embed(EmbedHeadRequest("small", texts=["y"]))
    assert made == [shared]
    assert [r.by_reference for _, r in bound.responses] == [False, True, False]
    assert not shared.responses


@pytest.mark.parametrize("outcome", [HANG, ray_exceptions.ActorDiedError(), None])
async def test_a_video_poke_never_raises(outcome: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(head_client, "WAKE_TIMEOUT_S", 0.05)
    handle = FakeHandle(outcome)
    assert await RayHeadClient("video", handle).wake() is None
    [(method, response)] = handle.responses
    assert method == "wake" and response.cancelled == (outcome is not None)


def test_each_bound_model_gets_the_one_client_filed_by_its_kind() -> None:
    chat = {"head": "chat", "context_length": 64, "max_output_tokens": 8}
    catalog = [
        CatalogModel.model_validate(entry)
        for entry in (
            {"id": "chat", **chat},
            {"id": "unbound-chat", **chat},
            {"id": "tts", "head": "speech"},
            {"id": "stt", "head": "transcription"},
            {"id": "layout", "head": "detect"},
            {"id": "ocr", "head": "parse"},
            {"id": "wan", "head": "video"},
        )
    ]
    handles = {m.id: FakeHandle(None) for m in catalog if m.id != "unbound-chat"}
    clients = ray_head_clients(catalog, handles)
    filed = {
        "chat": clients.chat,
        "speech": clients.speech,
        "transcription": clients.transcription,
        "documents": clients.documents,
        "video": clients.video,
    }
    assert {kind: sorted(ids) for kind, ids in filed.items()} == {
        "chat": ["chat"],
        "speech": ["tts"],
        "transcription": ["stt"],
        "documents": ["layout", "ocr"],
        "video": ["wan"],
    }
    every = [c for kind in filed.values() for c in kind.values()]
    assert all(isinstance(c, RayHeadClient) for c in every)
    assert {c.model_id for c in every} == set(handles)  # type: ignore[attr-defined]
