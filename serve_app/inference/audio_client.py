"""How the gateway reaches a speech or transcription head: a Ray handle, or in-process.

Both clients return the head's plain reply (a result or a ``HeadFailure``).
The Ray client maps Ray's own failures (backpressure, a lost replica, a task
error) to the spec's 503 and 502, and cancels the head call when the gateway
gives up waiting, so a route never sees a Ray exception type.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from deployments.speech_head import SpeechHeadCore
from deployments.transcription_head import TranscriptionHeadCore
from serve_app.catalog.config import CatalogModel
from serve_app.contract.audio import (
    SpeechHeadReply,
    SpeechHeadRequest,
    TranscriptionHeadReply,
    TranscriptionHeadRequest,
)
from serve_app.protocol.errors import GatewayError, ModelUnavailableError, UpstreamError

logger = logging.getLogger(__name__)


class SpeechClient(Protocol):
    async def synthesize(self, request: SpeechHeadRequest) -> SpeechHeadReply: ...


class TranscriptionClient(Protocol):
    async def transcribe(self, request: TranscriptionHeadRequest) -> TranscriptionHeadReply: ...


class LocalSpeechClient:
    """Calls a ``SpeechHeadCore`` in this process (unit tests, benchmarks)."""

    def __init__(self, core: SpeechHeadCore) -> None:
        self.core = core

    async def synthesize(self, request: SpeechHeadRequest) -> SpeechHeadReply:
        return await self.core.synthesize(request)


class LocalTranscriptionClient:
    """Calls a ``TranscriptionHeadCore`` in this process (unit tests, benchmarks)."""

    def __init__(self, core: TranscriptionHeadCore) -> None:
        self.core = core

    async def transcribe(self, request: TranscriptionHeadRequest) -> TranscriptionHeadReply:
        return await self.core.transcribe(request)


class RayAudioClient:
    """Calls a ``SpeechHead`` or ``TranscriptionHead`` deployment through its handle."""

    def __init__(self, model_id: str, handle: Any) -> None:
        self.model_id = model_id
        self._handle = handle

    async def synthesize(self, request: SpeechHeadRequest) -> SpeechHeadReply:
        reply: SpeechHeadReply = await self._call("synthesize", request)
        return reply

    async def transcribe(self, request: TranscriptionHeadRequest) -> TranscriptionHeadReply:
        reply: TranscriptionHeadReply = await self._call("transcribe", request)
        return reply

    async def _call(self, method: str, request: Any) -> Any:
        response = getattr(self._handle, method).remote(request)
        try:
            return await response
        except BaseException as err:
            response.cancel()  # a timeout or a client gone: stop the head's work too
            if isinstance(err, Exception):
                raise map_ray_error(self.model_id, err) from None
            raise


def map_ray_error(model_id: str, err: Exception) -> GatewayError:
    """Ray's failure types -> the spec's 503 (retryable) or 502."""
    from ray import exceptions as ray_exceptions
    from ray.serve import exceptions as serve_exceptions

    if isinstance(err, GatewayError):
        return err
    if isinstance(err, serve_exceptions.BackPressureError):
        return ModelUnavailableError(
            f"Model '{model_id}' is at capacity; retry shortly.", headers={"Retry-After": "1"}
        )
    if isinstance(err, ray_exceptions.ActorDiedError | ray_exceptions.ActorUnavailableError):
        logger.warning("head %s replica lost: %s", model_id, err)
        return ModelUnavailableError(f"Model '{model_id}' lost its replica; retry shortly.")
    logger.error("head %s failed: %s", model_id, err)
    return UpstreamError(f"Model '{model_id}' failed.")


def ray_audio_clients(
    catalog: list[CatalogModel], heads: dict[str, Any]
) -> tuple[dict[str, SpeechClient], dict[str, TranscriptionClient]]:
    """Ray clients for the bound speech and transcription heads, split by kind."""
    speech: dict[str, SpeechClient] = {}
    transcription: dict[str, TranscriptionClient] = {}
    for model in catalog:
        if model.id not in heads:
            continue
        if model.head == "speech":
            speech[model.id] = RayAudioClient(model.id, heads[model.id])
        elif model.head == "transcription":
            transcription[model.id] = RayAudioClient(model.id, heads[model.id])
    return speech, transcription
