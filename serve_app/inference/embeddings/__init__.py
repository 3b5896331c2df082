"""Embeddings, rerank and score: request rules, head calls, answers, per-token billing."""
