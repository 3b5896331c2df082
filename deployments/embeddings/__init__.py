"""Pooling heads: embeddings and scores (bi-encoder cosine or cross-encoder) on vLLM's
pooling runner. The engine contract (``base``), the vLLM backend (``vllm_engine``),
its settings (``config``), the backend registry (``factory``) and the Serve deployment
(``head``) live together here."""
