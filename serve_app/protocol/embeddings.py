"""Wire formats of ``POST /v1/embeddings``, ``/v1/rerank`` and ``/v1/score``.

Shapes and choices are documented in docs/api.md ("Embeddings, rerank and score"):
embeddings are OpenAI's shape; rerank is the Jina/Cohere shape vLLM serves; score
is vLLM's ``text_1``/``text_2`` shape. Request bodies are closed (``extra="forbid"``):
an unknown field is 400 ``unknown_parameter``, as on the responses route, because
nothing here is relayed to an engine. ``input`` is typed ``Any`` and classified by
the service (``serve_app.inference.embeddings.inputs``), so a wrong element is named
exactly (``input[2][5]``) instead of by pydantic's union branches.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, WithJsonSchema

from serve_app.protocol.common import WholeInt

_TOKENS = {"type": "array", "items": {"type": "integer"}, "minItems": 1}
INPUT_SCHEMA = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
        _TOKENS,
        {"type": "array", "items": _TOKENS, "minItems": 1},
    ],
    "description": "A string, an array of strings, an array of token ids, or an array of "
    "token-id arrays; never empty.",
}


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(min_length=1, description="A pooling model of the catalog.")
    user: StrictStr | None = Field(default=None, description="End-user id; accepted, not used.")


class EmbeddingRequest(_Closed):
    """Request body of ``POST /v1/embeddings``."""

    input: Annotated[Any, WithJsonSchema(INPUT_SCHEMA)] = Field(
        description="What to embed (see the schema); each element is embedded on its own."
    )
    encoding_format: Literal["float", "base64"] | None = Field(
        default=None,
        description="float (default): arrays of numbers; base64: each vector's "
        "little-endian float32 bytes, base64-encoded.",
    )
    dimensions: WholeInt | None = Field(
        default=None,
        ge=1,
        description="Shorter vectors, only on models trained for it (Matryoshka: the card's "
        "pooling.matryoshka_dimensions); elsewhere 400 unsupported_parameter.",
    )


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class PoolingUsage(BaseModel):
    prompt_tokens: int = Field(description="Input tokens, as the model counted them (billed).")
    total_tokens: int = Field(description="Equal to prompt_tokens: nothing is generated.")


class EmbeddingResponse(BaseModel):
    """200 body of ``POST /v1/embeddings``: one entry per input, in input order."""

    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: PoolingUsage


class RerankRequest(_Closed):
    """Request body of ``POST /v1/rerank``."""

    query: StrictStr = Field(min_length=1, description="What the documents are ranked for.")
    documents: list[Annotated[StrictStr, Field(min_length=1)]] = Field(
        min_length=1, description="Texts to rank (strings)."
    )
    top_n: WholeInt | None = Field(
        default=None, ge=1, description="Return only the best n; default: all."
    )
    return_documents: StrictBool = Field(
        default=True, description="Echo each document's text in its result."
    )


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int = Field(description="Position of the document in the request.")
    relevance_score: float
    document: RerankDocument | None = Field(
        default=None, description="Present when return_documents is true."
    )


class RerankResponse(BaseModel):
    """200 body of ``POST /v1/rerank``: results sorted by relevance_score, best first."""

    id: str
    object: Literal["rerank"] = "rerank"
    model: str
    results: list[RerankResult]
    usage: PoolingUsage


TextOrTexts = StrictStr | list[StrictStr]


class ScoreRequest(_Closed):
    """Request body of ``POST /v1/score``: 1:1, 1:N (one text_1) or N:N (pairwise)."""

    text_1: TextOrTexts = Field(description="A text, or a list as long as text_2.")
    text_2: TextOrTexts = Field(description="A text, or a list of texts to score.")


class ScoreData(BaseModel):
    object: Literal["score"] = "score"
    index: int = Field(description="Position of the pair (of text_2).")
    score: float


class ScoreResponse(BaseModel):
    """200 body of ``POST /v1/score``: one score per pair, in text_2's order."""

    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: PoolingUsage
