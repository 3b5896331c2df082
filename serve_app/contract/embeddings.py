"""Values the gateway and the pooling heads (embeddings, scores) exchange over a handle.

Plain dataclasses of builtins only, so a head can run in another process or
in-process in tests. Vectors cross as one ``bytes`` of little-endian float32,
row-major (``count x dimensions``): under half the size of a pickled list of
floats, and exactly the bytes the ``base64`` encoding format sends, so the gateway
encodes them without converting a single number. A head answers with its result or
one ``HeadFailure``, never by raising, so a 400 found in the head stays a 400.
"""

from __future__ import annotations

from dataclasses import dataclass

from serve_app.contract.errors import HeadFailure

VECTOR_DTYPE = "<f4"
"""numpy dtype of ``EmbedHeadResult.vectors``: little-endian float32 (OpenAI's base64)."""

ONE_ITEM_STREAM = "answer_streamed"
"""The head method that runs one of its unary methods (``embed``, ``score``) and yields
its reply as the only item of a stream: ``answer_streamed(method, *args)``. Over Serve's
gRPC transport a streamed item reaches the caller as soon as it is sent, where a unary
reply is handed over only with the call's final status (docs/tuning.md, embeddings)."""
ONE_ITEM_STREAM_METHODS = frozenset({"embed", "score"})
"""The methods a pooling head answers through ``ONE_ITEM_STREAM``."""


@dataclass
class EmbedHeadRequest:
    """Exactly one of ``texts`` and ``token_ids`` is set; both lists are non-empty."""

    request_id: str
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None
    dimensions: int | None = None
    """Matryoshka truncation (the model must support it); None: the model's own."""

    @property
    def count(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids or [])


@dataclass
class EmbedHeadResult:
    vectors: bytes
    """``count x dimensions`` float32 values (``VECTOR_DTYPE``), in input order."""
    dimensions: int
    prompt_tokens: int
    """Tokens of every input together, as the model counted them (what is billed)."""


@dataclass
class ScoreHeadRequest:
    """Score each of ``documents`` against a query: ``queries`` holds one query (scored
    against every document) or one per document (pairwise)."""

    request_id: str
    queries: list[str]
    documents: list[str]


@dataclass
class ScoreHeadResult:
    scores: list[float]
    """One per document, in the documents' order."""
    prompt_tokens: int


@dataclass(frozen=True)
class PoolingHeadInfo:
    """What a started pooling head serves (for logs and checks)."""

    max_model_len: int
    dimensions: int | None
    """Embedding size; None where the model does not embed (a cross-encoder)."""
    embeds: bool
    scores: bool
    score_kind: str
    """'bi-encoder' (cosine of the two embeddings) or 'cross-encoder' (the pair read together)."""


EmbedHeadReply = EmbedHeadResult | HeadFailure
ScoreHeadReply = ScoreHeadResult | HeadFailure
