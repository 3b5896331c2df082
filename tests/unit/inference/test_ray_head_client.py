"""The Ray head client: batches flattened, and a stream closed early cancels the head call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from serve_app.contract.text import GenerationDone, HeadStarted, TextDelta
from serve_app.inference.head_client import RayHeadClient
from serve_app.protocol.errors import UpstreamError

STARTED = HeadStarted(prompt_tokens=3, max_tokens=4)
DONE = GenerationDone(prompt_tokens=3, completion_tokens=2)


class FakeResponse:
    """Stands in for a ``DeploymentResponseGenerator``: items, and whether it was cancelled."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[Any]:
        for item in self.items:
            if isinstance(item, BaseException):
                raise item
            yield item

    def cancel(self) -> None:
        self.cancelled = True


class FakeHandle:
    def __init__(self, response: FakeResponse) -> None:
        self.response = response
        self.generate = self
        self.options_given: dict[str, Any] = {}

    def options(self, **options: Any) -> FakeHandle:
        self.options_given.update(options)
        return self

    def remote(self, _request: Any) -> FakeResponse:
        return self.response


def _client(items: list[Any]) -> tuple[RayHeadClient, FakeResponse]:
    response = FakeResponse(items)
    return RayHeadClient("m", FakeHandle(response)), response


async def test_batches_are_flattened_and_a_finished_stream_is_not_cancelled() -> None:
    client, response = _client([[STARTED], [TextDelta(0, "a"), TextDelta(0, "b")], DONE])
    events = [e async for e in client.stream(None)]  # type: ignore[arg-type]
    assert events == [STARTED, TextDelta(0, "a"), TextDelta(0, "b"), DONE]
    assert not response.cancelled


async def test_a_stream_closed_early_cancels_the_head_call() -> None:
    client, response = _client([[STARTED], [TextDelta(0, "a")], [DONE]])
    stream = client.stream(None)  # type: ignore[arg-type]
    assert await anext(stream) == STARTED
    await stream.aclose()  # type: ignore[attr-defined]  # e.g. a 429 after HeadStarted
    assert response.cancelled


def test_the_head_is_streamed_over_serves_grpc_transport() -> None:
    handle = FakeHandle(FakeResponse([]))
    RayHeadClient("m", handle)
    assert handle.options_given == {"stream": True, "_by_reference": False}


async def test_a_broken_grpc_stream_is_the_models_failure_not_a_transport_error() -> None:
    broken = grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), "stream reset"
    )
    client, _ = _client([[STARTED], broken])
    with pytest.raises(UpstreamError, match="Model 'm' failed"):
        _ = [e async for e in client.stream(None)]  # type: ignore[arg-type]
