"""Streamed chat logprobs on the real Qwen head (non-streamed: test_tools_images_e2e.py).

The gateway batches stream deltas; every token's logprob must still arrive once, in
order, with its alternatives, and spell out exactly the streamed text.
"""

from __future__ import annotations

import pytest

from tests.serve.conftest import QWEN, ServeStack

pytestmark = [pytest.mark.serve, pytest.mark.heads(QWEN)]


def test_streamed_logprobs_cover_every_token(serve_stack: ServeStack) -> None:
    stream = serve_stack.openai().chat.completions.create(
        model=QWEN,
        messages=[{"role": "user", "content": "Count from 1 to 50, separated by commas."}],
        logprobs=True,
        top_logprobs=2,
        max_tokens=10,  # cut before the end: every token has text
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, entries, usage, finish = "", [], None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
            if choice.logprobs is not None:
                entries.extend(choice.logprobs.content or [])
    assert finish == "length" and usage is not None and usage.completion_tokens == 10
    assert len(entries) == 10
    assert "".join(e.token for e in entries) == text
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
