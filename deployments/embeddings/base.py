"""The engine contract of a pooling head (embeddings and scores).

A pooling head (``deployments.embeddings.head``) owns one engine that it receives
from ``deployments.registry.build_engine``: vLLM's pooling runner on CPU or CUDA, or a
scripted engine in tests of the gateway's own logic.

Contract (read this before writing a backend):

1. ``start`` loads the model once, before the head reports healthy, and returns
   ``PoolingHeadInfo``: the context window, the embedding size, what it serves.
2. ``embed`` and ``score`` are ``async`` and never block the event loop.
3. ``embed`` returns one vector per input, in input order, as float32 bytes
   (``serve_app.contract.embeddings.VECTOR_DTYPE``), and the inputs' token count as
   the model's tokenizer counted it (with special tokens): that count is billed.
4. An input longer than the context window raises ``InvalidRequestError`` with code
   ``context_length_exceeded`` unless the engine was configured to truncate; a token
   id outside the vocabulary, ``dimensions`` the model cannot give, and a task the
   model does not serve raise ``InvalidRequestError`` too. Anything else raises and
   the head reports a 502.
"""

from __future__ import annotations

import abc

from serve_app.contract.embeddings import (
    EmbedHeadRequest,
    EmbedHeadResult,
    PoolingHeadInfo,
    ScoreHeadRequest,
    ScoreHeadResult,
)


class PoolingEngine(abc.ABC):
    """An embedding or scoring model bound to one loaded checkpoint."""

    @abc.abstractmethod
    async def start(self) -> PoolingHeadInfo:
        """Load the model; called once by the head before it reports healthy."""

    @abc.abstractmethod
    async def embed(self, request: EmbedHeadRequest) -> EmbedHeadResult:
        """One vector per input, in input order."""

    @abc.abstractmethod
    async def score(self, request: ScoreHeadRequest) -> ScoreHeadResult:
        """One relevance score per document, in the documents' order."""

    async def check_health(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None
