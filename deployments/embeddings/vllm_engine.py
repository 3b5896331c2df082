"""The vLLM backend of ``PoolingEngine``: one in-process ``AsyncLLM`` with ``runner="pooling"``.

Requests are served by vLLM's own pooling serving layer, as vLLM's API server
builds it (``init_pooling_state``): ``ServingEmbedding`` for embeddings,
``ServingScores`` for scores (bi-encoder: the cosine of the two embeddings;
cross-encoder: the pair read together). Tokenization, special tokens, lower-casing,
the context-window check (or truncation), Matryoshka ``dimensions``, batching over
the engine, pooling and normalisation are vLLM's code. The one seam: each serving
class answers through ``_build_response``, which here returns the contract's plain
values (vectors as float32 bytes, scores, token counts) instead of a JSON response,
so the gateway encodes the wire format once and nothing is parsed twice. It runs in
vLLM's post-processing thread, off the event loop.

vLLM is imported lazily so that importing this module (configs, the factory's
registry, ``gateway check``) does not need vLLM or pay its import.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from types import SimpleNamespace
from typing import Any

from deployments.embeddings.base import PoolingEngine
from deployments.embeddings.config import VLLMPoolingConfig
from deployments.local_models.resolve import resolve_model
from deployments.vllm_start import (
    TOO_LONG_PHRASES,
    map_vllm_error,
    start_async_llm,
    vllm_device_type,
)
from serve_app.contract.embeddings import (
    VECTOR_DTYPE,
    EmbedHeadRequest,
    EmbedHeadResult,
    PoolingHeadInfo,
    ScoreHeadRequest,
    ScoreHeadResult,
)
from serve_app.contract.errors import (
    GatewayError,
    InvalidRequestError,
    ModelUnavailableError,
)

logger = logging.getLogger(__name__)

_TOO_LONG = (*TOO_LONG_PHRASES, "max_model_len")


@functools.cache
def _vllm() -> SimpleNamespace:
    """The vLLM names this backend uses, imported on first use (in a worker thread)."""
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
    from vllm.entrypoints.pooling.embed.serving import ServingEmbedding
    from vllm.entrypoints.pooling.scoring.protocol import ScoreTextRequest
    from vllm.entrypoints.pooling.scoring.serving import ServingScores
    from vllm.entrypoints.pooling.utils import enable_scoring_api
    from vllm.outputs import ScoringRequestOutput
    from vllm.renderers.chat_utils import ChatTemplateConfig
    from vllm.tasks import SCORE_TYPE_MAP

    return SimpleNamespace(
        BaseModelPath=BaseModelPath,
        OpenAIServingModels=OpenAIServingModels,
        EmbeddingCompletionRequest=EmbeddingCompletionRequest,
        ServingEmbedding=ServingEmbedding,
        ScoreTextRequest=ScoreTextRequest,
        ServingScores=ServingScores,
        enable_scoring_api=enable_scoring_api,
        ScoringRequestOutput=ScoringRequestOutput,
        ChatTemplateConfig=ChatTemplateConfig,
        SCORE_TYPE_MAP=SCORE_TYPE_MAP,
    )


def map_pooling_error(exc: BaseException) -> GatewayError:
    """A vLLM exception -> the gateway's error vocabulary (client mistakes are 400s)."""
    return map_vllm_error(
        exc, _pooling_mistake, mistakes=(ValueError, TypeError, OverflowError), too_long=_TOO_LONG
    )


def _pooling_mistake(message: str, parameter: str | None, too_long: bool) -> GatewayError:
    if too_long:
        return InvalidRequestError(message, code="context_length_exceeded", param="input")
    if parameter == "dimensions" or "Matryoshka" in message:
        return InvalidRequestError(message, code="unsupported_parameter", param="dimensions")
    return InvalidRequestError(message, code="invalid_value", param="input")


def _as_float32_bytes(rows: list[Any]) -> tuple[bytes, int]:
    """Pooled tensors (one per input) -> row-major little-endian float32 bytes."""
    import torch

    matrix = torch.stack([row.reshape(-1) for row in rows]).to(torch.float32).cpu().numpy()
    return matrix.astype(VECTOR_DTYPE, copy=False).tobytes(), int(matrix.shape[1])


def _plain_embedding(base: type) -> type:
    """``ServingEmbedding`` answering with ``EmbedHeadResult`` instead of JSON."""

    class _PlainEmbedding(base):
        def _build_response(self, ctx: Any) -> EmbedHeadResult:
            outputs = ctx.final_res_batch
            vectors, dimensions = _as_float32_bytes([out.outputs.data for out in outputs])
            tokens = sum(len(out.prompt_token_ids or ()) for out in outputs)
            return EmbedHeadResult(vectors=vectors, dimensions=dimensions, prompt_tokens=tokens)

    return _PlainEmbedding


def _plain_scores(base: type, scoring_output: Any) -> type:
    """``ServingScores`` answering with ``ScoreHeadResult`` instead of JSON."""

    class _PlainScores(base):
        def _build_response(self, ctx: Any) -> ScoreHeadResult:
            scores = [
                float(scoring_output.from_base(out).outputs.score) for out in ctx.final_res_batch
            ]
            tokens = sum(
                self._extract_prompt_len(engine_input["prompts"])
                for engine_input in ctx.engine_inputs or []
            )
            return ScoreHeadResult(scores=scores, prompt_tokens=int(tokens))

    return _PlainScores


class VLLMPoolingEngine(PoolingEngine):
    """``PoolingEngine`` over vLLM's ``AsyncLLM`` (CPU or CUDA build, whichever is installed)."""

    def __init__(self, config: VLLMPoolingConfig, served_name: str = "") -> None:
        self.config = config
        self._served_name = served_name
        self._engine: Any = None
        self._embedding: Any = None
        self._scores: Any = None
        self._info: PoolingHeadInfo | None = None

    async def start(self) -> PoolingHeadInfo:
        """Start the EngineCore process (call once); blocking work runs in threads."""
        if self._info is not None:
            return self._info
        device_type = await vllm_device_type(self.config.device)
        vllm = await asyncio.to_thread(_vllm)
        model_path = await asyncio.to_thread(resolve_model, self.config.model)
        kwargs = self.config.engine_kwargs(device_type, model_path, self._served_name or "model")
        started = time.monotonic()
        engine = await start_async_llm(kwargs)
        self._engine = engine
        tasks = tuple(await engine.get_supported_tasks())
        self._info = await asyncio.to_thread(self._build_serving, engine, vllm, kwargs, tasks)
        logger.info(
            "vLLM pooling engine for %s up on %s in %.1f s (%s)",
            model_path,
            device_type,
            time.monotonic() - started,
            self._info,
        )
        return self._info

    def _build_serving(
        self, engine: Any, vllm: SimpleNamespace, kwargs: dict[str, Any], tasks: tuple[str, ...]
    ) -> PoolingHeadInfo:
        """vLLM's pooling serving objects over this engine, as its own server builds them."""
        self._served_name = str(kwargs["served_model_name"])
        model_config = engine.model_config
        models = vllm.OpenAIServingModels(
            engine, [vllm.BaseModelPath(name=self._served_name, model_path=kwargs["model"])]
        )
        template = vllm.ChatTemplateConfig()
        pooling_task = model_config.get_pooling_task(tasks)
        embeds = pooling_task == "embed"
        scores = bool(vllm.enable_scoring_api(tasks, model_config))
        if embeds:
            self._embedding = _plain_embedding(vllm.ServingEmbedding)(
                engine, models, request_logger=None, chat_template_config=template
            )
        if scores:
            self._scores = _plain_scores(vllm.ServingScores, vllm.ScoringRequestOutput)(
                engine,
                models,
                supported_tasks=tasks,
                request_logger=None,
                chat_template_config=template,
            )
        return PoolingHeadInfo(
            max_model_len=int(model_config.max_model_len),
            dimensions=int(model_config.embedding_size) if embeds else None,
            embeds=embeds,
            scores=scores,
            score_kind=str(vllm.SCORE_TYPE_MAP.get(pooling_task, "")),
        )

    async def embed(self, request: EmbedHeadRequest) -> EmbedHeadResult:
        serving = self._serving(self._embedding, "embeddings")
        body: dict[str, Any] = {
            "model": self._served_name,
            "input": request.texts if request.texts is not None else request.token_ids,
            "request_id": request.request_id,
        }
        if request.dimensions is not None:
            body["dimensions"] = request.dimensions
        if self.config.truncate:
            body["truncate_prompt_tokens"] = -1
        result: EmbedHeadResult = await self._run(serving, _vllm().EmbeddingCompletionRequest, body)
        return result

    async def score(self, request: ScoreHeadRequest) -> ScoreHeadResult:
        serving = self._serving(self._scores, "scores")
        body: dict[str, Any] = {
            "model": self._served_name,
            "text_1": request.queries[0] if len(request.queries) == 1 else request.queries,
            "text_2": request.documents,
            "request_id": request.request_id,
        }
        if self.config.truncate:
            body["truncate_prompt_tokens"] = -1
        result: ScoreHeadResult = await self._run(serving, _vllm().ScoreTextRequest, body)
        return result

    async def _run(self, serving: Any, request_cls: Any, body: dict[str, Any]) -> Any:
        try:
            request = request_cls.model_validate(body)
            return await serving(request)
        except Exception as exc:
            raise map_pooling_error(exc) from exc

    def _serving(self, serving: Any, what: str) -> Any:
        if self._engine is None:
            raise ModelUnavailableError("The model engine is not started.", code="model_warming")
        if serving is None:
            raise InvalidRequestError(
                f"This model does not serve {what}.", code="model_not_supported_for_endpoint"
            )
        return serving

    async def check_health(self) -> None:
        if self._engine is None:
            raise ModelUnavailableError("The model engine is not started.", code="model_warming")
        try:
            await self._engine.check_health()
        except Exception as exc:
            raise map_pooling_error(exc) from exc

    async def shutdown(self) -> None:
        """Stop the EngineCore process; the engine cannot be restarted afterwards."""
        engine, self._engine, self._info = self._engine, None, None
        self._embedding = self._scores = None
        if engine is not None:
            await asyncio.to_thread(engine.shutdown)
            del engine
            gc.collect()  # AsyncLLM sits in reference cycles (see vllm_engine.shutdown)
