"""``answer_streamed`` on a pooling head: what the gateway reads for a small pooling call."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from serve_app.contract.embeddings import (
    ONE_ITEM_STREAM,
    ONE_ITEM_STREAM_METHODS,
    EmbedHeadRequest,
    EmbedHeadResult,
    ScoreHeadRequest,
    ScoreHeadResult,
)
from serve_app.contract.errors import HeadFailure
from tests.fakes.scripted_pooling import ScriptedPoolingEngine


async def test_a_pooling_head_streams_one_reply_of_embed_or_score_and_nothing_else() -> None:
    from deployments.embeddings.head import PoolingHead, PoolingHeadCore
    from deployments.engine_head import EngineHead

    assert PoolingHead.func_or_class.one_item_streams == ONE_ITEM_STREAM_METHODS
    core = PoolingHeadCore(ScriptedPoolingEngine())
    await core.start()
    # A plain object in the replica's place (an EngineHead instance, once collected,
    # would run its async __del__ as a coroutine nobody awaits).
    head: Any = SimpleNamespace(
        one_item_streams=ONE_ITEM_STREAM_METHODS, embed=core.embed, score=core.score
    )

    def stream(method: str, *args: Any) -> Any:
        return getattr(EngineHead, ONE_ITEM_STREAM)(head, method, *args)

    embed = EmbedHeadRequest("e1", texts=["a cat", "on a mat"])
    [embedded] = [item async for item in stream("embed", embed)]
    assert isinstance(embedded, EmbedHeadResult)
    assert embedded == await core.embed(embed)
    [scored] = [item async for item in stream("score", ScoreHeadRequest("s", ["cat"], ["a cat"]))]
    assert isinstance(scored, ScoreHeadResult) and len(scored.scores) == 1
    too_long = EmbedHeadRequest("e2", texts=["word " * 1000])
    [refused] = [item async for item in stream("embed", too_long)]
    assert isinstance(refused, HeadFailure)  # a refusal is still the one item, as a value
    with pytest.raises(ValueError, match="does not stream 'stats'"):
        [item async for item in stream("stats")]
