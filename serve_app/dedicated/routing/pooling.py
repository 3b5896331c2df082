"""Embeddings, rerank and score through ``ded/<slug>``: the pooling endpoint's client.

``DedicatedRouter.pooling_head_for`` admits the call as it does a chat call (503
while the endpoint cannot serve; an endpoint at rest boots a replica for it) and
returns this client. It picks the deployment (hybrid: the reserved floor first),
calls the endpoint's pooling head and writes one ``dedicated_requests`` row per
call: outcome, latency, cold wait and the input tokens the model counted. A pooling
head sends one whole answer, so there is no TTFT and no serving replica id.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol, TypeVar

from serve_app.contract.embeddings import (
    EmbedHeadReply,
    EmbedHeadRequest,
    ScoreHeadReply,
    ScoreHeadRequest,
)
from serve_app.contract.errors import HeadFailure
from serve_app.dedicated.alias import app_name_for
from serve_app.dedicated.control.backend import ServeBackend
from serve_app.dedicated.options import DedicatedOptions
from serve_app.dedicated.routing.floor import FloorCounts
from serve_app.dedicated.store import EndpointRow
from serve_app.heads.client import PoolingClient

Reply = TypeVar("Reply", EmbedHeadReply, ScoreHeadReply)


class CallRouter(Protocol):
    """What a call needs of ``DedicatedRouter`` (named here: the router imports this)."""

    options: DedicatedOptions
    backend: ServeBackend
    clock: Callable[[], datetime]
    floor: FloorCounts
    in_flight: defaultdict[tuple[str, str], int]
    pending_rows: list[dict[str, Any]]

    async def choose_deployment(self, row: EndpointRow, call_id: str) -> str: ...

    def counts_floor(self, row: EndpointRow) -> bool: ...


def pooling_call_row(
    endpoint_id: str, woke: bool, at: datetime, started: float, reply: object | None
) -> dict[str, Any]:
    """One ``dedicated_requests`` row; ``reply`` None: the call raised or was cancelled."""
    latency_ms = int((time.monotonic() - started) * 1000)
    ok = reply is not None and not isinstance(reply, HeadFailure)
    return {
        "endpoint_id": endpoint_id,
        "at": at,
        "outcome": "ok" if ok else "error",
        "replica_id": None,
        "woke": woke,
        "ttft_ms": None,
        "latency_ms": latency_ms,
        "cold_wait_ms": latency_ms if woke else None,
        "cached_tokens": None,
        "prompt_tokens": int(getattr(reply, "prompt_tokens", 0)) if ok else 0,
        "completion_tokens": 0,
    }


class DedicatedPoolingClient:
    """A ``PoolingClient`` for one call to one pooling endpoint's Serve app.

    ``first_event_s``: as ``DedicatedHeadClient``'s, the longer wait a call that
    wakes an endpoint at rest is given (the embeddings service takes the larger of it
    and its own timeout).
    """

    def __init__(self, router: CallRouter, row: EndpointRow, woke: bool) -> None:
        self.router = router
        self.row = row
        self.woke = woke
        self.first_event_s: float | None = router.options.wake_timeout_s if woke else None

    async def embed(self, request: EmbedHeadRequest) -> EmbedHeadReply:
        return await self._call(request.request_id, lambda head: head.embed(request))

    async def score(self, request: ScoreHeadRequest) -> ScoreHeadReply:
        return await self._call(request.request_id, lambda head: head.score(request))

    async def _call(
        self, request_id: str, call: Callable[[PoolingClient], Awaitable[Reply]]
    ) -> Reply:
        router, row = self.router, self.row
        app = app_name_for(row.slug)
        call_id = f"{request_id}:{uuid.uuid4().hex[:12]}"
        deployment = await router.choose_deployment(row, call_id)
        head = router.backend.pooling_client(app, deployment, row.alias)
        at, started = router.clock(), time.monotonic()
        key = (app, deployment)
        router.in_flight[key] += 1
        reply: Reply | None = None
        try:
            reply = await call(head)
            return reply
        finally:
            router.in_flight[key] -= 1
            router.pending_rows.append(pooling_call_row(row.id, self.woke, at, started, reply))
            if router.counts_floor(row):
                await router.floor.release(app, deployment, call_id)
