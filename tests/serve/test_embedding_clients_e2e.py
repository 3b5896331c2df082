"""Third-party clients against ``/v1/embeddings`` on the real pooling head (all-MiniLM-L6-v2):
LangChain's ``OpenAIEmbeddings`` and LiteLLM's ``embedding()``, as a RAG application calls them.

Both are in the dev extra: LiteLLM's SDK alone fits the project's venv (its ``[proxy]`` extra,
which the proxy bench runs from ``bench/.venv-litellm``, does not).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.serve.conftest import MINILM, ServeStack

pytestmark = [pytest.mark.serve, pytest.mark.heads(MINILM)]

TEXTS = ["The cat sits on the mat.", "A feline rests on a rug.", "Stock markets fell today."]


def _check_vectors(vectors: list[list[float]]) -> None:
    """Three normalised 384-dim vectors in input order: the paraphrase is the closest."""
    matrix = np.array(vectors)
    assert matrix.shape == (3, 384)
    assert np.linalg.norm(matrix, axis=1) == pytest.approx([1.0, 1.0, 1.0], abs=1e-3)
    assert matrix[0] @ matrix[1] > matrix[0] @ matrix[2] + 0.3


def test_langchain_openai_embeddings(serve_stack: ServeStack) -> None:
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: otherwise LangChain tokenizes with OpenAI's tiktoken
    # and sends those token ids, which mean nothing to another model's vocabulary
    # (docs/api.md, "Embeddings, rerank and score").
    embedder = OpenAIEmbeddings(
        model=MINILM,
        base_url=f"{serve_stack.base_url}/v1",
        api_key=serve_stack.key,  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    documents = embedder.embed_documents(TEXTS)
    query = embedder.embed_query(TEXTS[0])
    _check_vectors(documents)
    assert query == pytest.approx(documents[0], abs=1e-5)


def test_litellm_embedding(serve_stack: ServeStack, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its bundled price table: no fetch of the remote one (and no retries without a network).
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    answer = litellm.embedding(
        model=f"openai/{MINILM}",
        input=TEXTS,
        api_base=f"{serve_stack.base_url}/v1",
        api_key=serve_stack.key,
    )
    _check_vectors([item["embedding"] for item in answer.data])
    assert answer.usage.prompt_tokens > 3 * 2
