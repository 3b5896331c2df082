"""The pooling head: one Ray Serve deployment per embedding or scoring model.

``PoolingHeadCore`` holds the head's rules (started or not, what the model serves,
errors as ``HeadFailure`` values) as plain async Python, so the gateway's tests run
it in-process around a scripted engine; ``PoolingHead`` is the thin Serve wrapper.
"""

from __future__ import annotations

from typing import Any

from ray import serve

from deployments.direct_http import refuse_direct_http
from deployments.embeddings.base import PoolingEngine
from deployments.embeddings.config import VLLMPoolingConfig
from deployments.engine_head import EngineHead, answer_as_value
from deployments.replica_counters import ReplicaCounters
from serve_app.contract.dedicated import ReplicaStats
from serve_app.contract.embeddings import (
    ONE_ITEM_STREAM_METHODS,
    EmbedHeadReply,
    EmbedHeadRequest,
    EmbedHeadResult,
    PoolingHeadInfo,
    ScoreHeadReply,
    ScoreHeadRequest,
    ScoreHeadResult,
)
from serve_app.contract.errors import HeadFailure, InvalidRequestError, ModelUnavailableError


class PoolingHeadCore:
    """What the model serves, checked before its engine is asked; errors as values."""

    def __init__(self, engine: PoolingEngine) -> None:
        self.engine = engine
        self.info: PoolingHeadInfo | None = None

    async def start(self) -> PoolingHeadInfo:
        self.info = await self.engine.start()
        return self.info

    async def embed(self, request: EmbedHeadRequest) -> EmbedHeadReply:
        info = self._started()
        if isinstance(info, HeadFailure):
            return info
        if not info.embeds:
            return _not_served("embeddings", "/v1/rerank or /v1/score")
        return await answer_as_value("embedding", request.request_id, self.engine.embed(request))

    async def score(self, request: ScoreHeadRequest) -> ScoreHeadReply:
        info = self._started()
        if isinstance(info, HeadFailure):
            return info
        if not info.scores:
            return _not_served("scores", "/v1/embeddings")
        return await answer_as_value("scoring", request.request_id, self.engine.score(request))

    def _started(self) -> PoolingHeadInfo | HeadFailure:
        if self.info is None:
            return HeadFailure.from_error(
                ModelUnavailableError("The pooling head is still starting.", code="model_warming")
            )
        return self.info


def _not_served(what: str, instead: str) -> HeadFailure:
    return HeadFailure.from_error(
        InvalidRequestError(
            f"This model does not serve {what}; use {instead}.",
            code="model_not_supported_for_endpoint",
            param="model",
        )
    )


@serve.deployment(ray_actor_options={"num_cpus": 0.25})
class PoolingHead(EngineHead):
    """Ray Serve replica hosting one pooling engine, built by the backend registry."""

    kind = "pooling"
    core: PoolingHeadCore
    one_item_streams = ONE_ITEM_STREAM_METHODS

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits async constructors
        self, model_id: str, backend: str, engine_config: dict[str, Any], peers: Any = None
    ) -> None:
        """``peers`` only binds a dedicated hybrid endpoint's ``burst`` deployment into the
        same app (unused): a dedicated endpoint of a pooling model runs this head in its own
        ``ded-<slug>`` app (``serve_app.dedicated.control.ray_backend``)."""
        default_seqs = VLLMPoolingConfig.model_fields["max_num_seqs"].default
        self.counters = ReplicaCounters.in_replica(
            engine_config, default_seqs if backend == "vllm" else None
        )
        # The engine's builder takes the catalog id too (the name vLLM serves it under).
        await self.start_engine(model_id, backend, engine_config, PoolingHeadCore, model_id)

    async def embed(self, request: EmbedHeadRequest) -> EmbedHeadReply:
        with self.counters.call(request.count):
            reply = await self.core.embed(request)
        if isinstance(reply, EmbedHeadResult):
            self.counters.tokens += reply.prompt_tokens
        return reply

    async def score(self, request: ScoreHeadRequest) -> ScoreHeadReply:
        with self.counters.call(len(request.documents)):
            reply = await self.core.score(request)
        if isinstance(reply, ScoreHeadResult):
            self.counters.tokens += reply.prompt_tokens
        return reply

    async def stats(self) -> ReplicaStats:
        """Input tokens, calls and inputs in flight: a dedicated endpoint's replica health."""
        return self.counters.stats()

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Inputs beyond ``max_num_seqs`` waiting: the ``engine_target_waiting`` knob."""
        return self.counters.autoscaling_metrics()

    async def __call__(self, request: Any) -> Any:
        """HTTP sent to a dedicated endpoint's replica itself: a 404 envelope."""
        return refuse_direct_http()
