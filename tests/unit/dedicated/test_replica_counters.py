"""The counters both dedicated head kinds report for replica health and autoscaling."""

from __future__ import annotations

import pytest

from deployments.replica_counters import ENGINE_WAITING_METRIC, ReplicaCounters, queue_split
from serve_app.dedicated.control import autoscaling


def test_the_metric_name_is_the_one_the_policy_reads() -> None:
    # The policy module may import nothing of the heads (the controller unpickles it).
    assert ENGINE_WAITING_METRIC == autoscaling.ENGINE_WAITING_METRIC


@pytest.mark.parametrize(
    ("in_flight", "seqs", "split"),
    [(0, 4, (0, 0)), (3, 4, (3, 0)), (9, 4, (4, 5)), (5, None, (5, None))],
)
def test_queue_split(in_flight: int, seqs: int | None, split: tuple[int, int | None]) -> None:
    assert queue_split(in_flight, seqs) == split


def test_sequences_are_in_flight_only_while_the_call_runs() -> None:
    counters = ReplicaCounters(replica_id="r1", max_num_seqs=16)
    with counters.call(sequences=12), counters.call(sequences=10):
        stats = counters.stats()
        assert (stats.running, stats.waiting) == (16, 6)
        assert counters.autoscaling_metrics() == {ENGINE_WAITING_METRIC: 6.0}
    with pytest.raises(RuntimeError), counters.call(sequences=3):
        raise RuntimeError("the engine failed")
    counters.tokens += 40
    stats = counters.stats()
    assert (stats.calls, stats.running, stats.waiting, stats.tokens) == (3, 0, 0, 40)
    assert stats.replica_id == "r1" and stats.age_s >= 0


# Python's own __del__ on the collected instance makes Serve's async destructor a coroutine.
@pytest.mark.filterwarnings("ignore:coroutine 'EngineHead.__del__' was never awaited")
async def test_a_pooling_replica_counts_input_tokens_and_inputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``PoolingHead`` as Serve runs it, on the scripted pooling engine."""
    from types import SimpleNamespace

    from ray import serve

    from deployments import engine_head
    from deployments.embeddings.head import PoolingHead
    from serve_app.contract.embeddings import EmbedHeadRequest, ScoreHeadRequest

    # The replica's logging set-up would rewire this process's loggers for later tests.
    monkeypatch.setattr(engine_head, "configure_replica_logging", lambda: None)
    context = SimpleNamespace(replica_id=SimpleNamespace(unique_id="pool-1"))
    monkeypatch.setattr(serve, "get_replica_context", lambda: context)
    head = PoolingHead.func_or_class.__new__(PoolingHead.func_or_class)
    backend = "tests.fakes.scripted_pooling:ScriptedPoolingEngine"
    await PoolingHead.func_or_class.__init__(head, "pool", backend, {"max_num_seqs": 2})
    embedded = await head.embed(EmbedHeadRequest("e1", texts=["a cat", "on a mat today"]))
    scored = await head.score(ScoreHeadRequest("s1", ["cat"], ["a cat", "bonds"]))
    refused = await head.embed(EmbedHeadRequest("e2", texts=["word " * 100]))  # too long
    stats = await head.stats()
    assert stats.replica_id == "pool-1" and stats.calls == 3
    assert stats.tokens == embedded.prompt_tokens + scored.prompt_tokens > 0
    assert not hasattr(refused, "prompt_tokens")  # a refusal is no work done
    assert (stats.running, stats.waiting) == (0, 0)
    assert head.record_autoscaling_stats() == {ENGINE_WAITING_METRIC: 0.0}
    await head.__del__()  # what Serve awaits when the replica stops
