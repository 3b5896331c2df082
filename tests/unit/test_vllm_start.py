"""The shared vLLM start sequence (``deployments/vllm_start.py``) and the single-engine heads'
shared lifecycle (``deployments/engine_head.py``), without starting an engine."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from deployments import engine_head, vllm_start
from serve_app.contract.errors import HeadFailure, InvalidRequestError


@dataclass
class _Args:
    """Stands in for ``AsyncEngineArgs``: the start checks names against its fields."""

    model: str = ""
    max_num_seqs: int = 1
    logging_config: Any = None


@dataclass
class _Core:
    readers_started: int = 0

    def _ensure_output_queue_task(self) -> None:
        self.readers_started += 1


@dataclass
class _Engine:
    args: _Args
    stat_loggers: Any
    engine_core: _Core = field(default_factory=_Core)


class _AsyncLLM:
    built_with: ClassVar[list[str | None]] = []
    """``VLLM_ENABLE_V1_MULTIPROCESSING`` as each build saw it (its EngineCore inherits it)."""

    @staticmethod
    def from_engine_args(args: _Args, stat_loggers: Any = None) -> _Engine:
        _AsyncLLM.built_with.append(os.environ.get(vllm_start.IN_PROCESS_WORKER))
        return _Engine(args, stat_loggers)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_start, "_engine_classes", lambda: (_Args, _AsyncLLM))
    monkeypatch.setattr(vllm_start, "vllm_logging_config", lambda: "no-dictconfig")
    monkeypatch.setattr(vllm_start, "_device_type", lambda: "cpu")
    monkeypatch.delenv(vllm_start.IN_PROCESS_WORKER, raising=False)
    _AsyncLLM.built_with.clear()


async def test_a_cpu_engine_is_built_with_its_model_in_the_engine_process_only(
    fake_vllm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set for the build (the EngineCore it spawns inherits it), gone after: a synchronous
    ``vllm.LLM`` built later in the same process must not run its engine in-process."""
    await vllm_start.start_async_llm({"model": "m"})
    assert _AsyncLLM.built_with == ["0"]
    assert vllm_start.IN_PROCESS_WORKER not in os.environ
    monkeypatch.setenv(vllm_start.IN_PROCESS_WORKER, "1")  # the operator's choice wins
    await vllm_start.start_async_llm({"model": "m"})
    assert _AsyncLLM.built_with == ["0", "1"]
    assert os.environ[vllm_start.IN_PROCESS_WORKER] == "1"
    monkeypatch.delenv(vllm_start.IN_PROCESS_WORKER)
    monkeypatch.setattr(vllm_start, "_device_type", lambda: "cuda")  # nothing to say on a GPU
    await vllm_start.start_async_llm({"model": "m"})
    assert _AsyncLLM.built_with == ["0", "1", None]


async def test_start_keeps_vllm_logging_out_and_starts_the_reader(fake_vllm: None) -> None:
    engine = await vllm_start.start_async_llm({"model": "m", "max_num_seqs": 8}, stat_loggers=[1])
    assert engine.args == _Args(model="m", max_num_seqs=8, logging_config="no-dictconfig")
    assert engine.stat_loggers == [1]
    assert engine.engine_core.readers_started == 1


async def test_a_callers_logging_config_wins(fake_vllm: None) -> None:
    engine = await vllm_start.start_async_llm({"model": "m", "logging_config": "own"})
    assert engine.args.logging_config == "own"


async def test_unknown_engine_args_are_named_before_anything_starts(fake_vllm: None) -> None:
    with pytest.raises(ValueError, match="Unknown vLLM engine args: bogus, zeta"):
        await vllm_start.start_async_llm({"model": "m", "zeta": 1, "bogus": 2})


async def test_a_device_other_than_the_builds_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vllm_start, "_device_type", lambda: "cpu")
    assert await vllm_start.vllm_device_type("auto") == "cpu"
    assert await vllm_start.vllm_device_type("cpu") == "cpu"
    with pytest.raises(RuntimeError, match=r"asks for device 'cuda'.*targets 'cpu'"):
        await vllm_start.vllm_device_type("cuda")


async def test_cpu_engines_leave_their_workers_unpinned_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = vllm_start.CPU_THREADS_BIND
    monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(vllm_start.IN_PROCESS_WORKER, raising=False)  # restored after the test
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # what Ray set for the replica
    monkeypatch.setattr(vllm_start.os, "sched_getaffinity", lambda _: {0, 1})
    monkeypatch.setattr(vllm_start, "_device_type", lambda: "cuda")
    await vllm_start.vllm_device_type("auto")
    assert name not in os.environ  # a GPU build: nothing to say
    monkeypatch.setattr(vllm_start, "_device_type", lambda: "cpu")
    await vllm_start.vllm_device_type("auto")
    # auto's count on two cores: one reserved for the scheduler, one thread
    assert (os.environ[name], os.environ["OMP_NUM_THREADS"]) == ("nobind", "1")
    assert vllm_start.IN_PROCESS_WORKER not in os.environ  # only while an engine is built
    monkeypatch.setenv(name, "0-1")  # the operator's choice is kept, threads and all
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    await vllm_start.vllm_device_type("auto")
    assert (os.environ[name], os.environ["OMP_NUM_THREADS"]) == ("0-1", "2")
    kept = {vllm_start.IN_PROCESS_WORKER: "1", name: "auto"}
    assert vllm_start.cpu_engine_env(kept) == {}  # the operator chose both
    assert vllm_start.cpu_engine_env({})[vllm_start.IN_PROCESS_WORKER] == "0"
    many = vllm_start.cpu_thread_env({})
    assert many["OMP_NUM_THREADS"] == "1"  # the patched two cores
    monkeypatch.setattr(vllm_start.os, "sched_getaffinity", lambda _: set(range(16)))
    assert vllm_start.cpu_thread_env({})["OMP_NUM_THREADS"] == "15"


async def test_answer_as_value_keeps_a_callers_status_and_hides_crashes() -> None:
    async def refused() -> int:
        raise InvalidRequestError("bad input", code="invalid_value", param="input")

    async def crashed() -> int:
        raise KeyError("boom")

    async def fine() -> int:
        return 7

    assert await engine_head.answer_as_value("embedding", "r1", fine()) == 7
    bad = await engine_head.answer_as_value("embedding", "r1", refused())
    assert isinstance(bad, HeadFailure) and bad.status_code == 400 and bad.code == "invalid_value"
    broken = await engine_head.answer_as_value("embedding", "r1", crashed())
    assert isinstance(broken, HeadFailure) and broken.status_code == 502
    assert "The embedding model failed" in broken.message


class _Lifecycle:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def check_health(self) -> None:
        self.calls.append("health")

    async def shutdown(self) -> None:
        self.calls.append("shutdown")


async def test_engine_head_lifecycle_reaches_the_engine() -> None:
    # Called on a plain object: an EngineHead instance would, once collected, run its async
    # __del__ as a coroutine nobody awaits (Serve awaits it on a real replica).
    engine = _Lifecycle()
    head: Any = SimpleNamespace(core=SimpleNamespace(engine=engine))
    await engine_head.EngineHead.wake(head)
    await engine_head.EngineHead.check_health(head)
    await engine_head.EngineHead.__del__(head)
    assert engine.calls == ["health", "shutdown"]


def test_engine_state_errors_shared_by_every_vllm_head() -> None:
    from http import HTTPStatus

    from vllm.exceptions import GracefulHTTPError
    from vllm.v1.engine.exceptions import EngineDeadError

    ours = InvalidRequestError("bad", code="invalid_value")
    assert vllm_start.engine_state_error(ours) is ours
    dead = vllm_start.engine_state_error(EngineDeadError("gone"))
    assert dead is not None and (dead.status_code, dead.code) == (503, "engine_dead")
    busy = vllm_start.engine_state_error(GracefulHTTPError("full", HTTPStatus(503)))
    assert busy is not None and busy.status_code == 503 and busy.message == "full"
    gone = vllm_start.engine_state_error(GracefulHTTPError("no such", HTTPStatus(404)))
    assert gone is not None and gone.status_code == 404
    assert vllm_start.engine_state_error(ValueError("a caller's mistake?")) is None


def test_each_vllm_head_names_a_callers_mistake_its_own_way() -> None:
    """The one mapping (``map_vllm_error``) as the chat and pooling heads call it: the same
    exception is a 400 on both, coded by the head's routes; a crash is a 502 on both."""
    from deployments.chat.vllm_engine import map_engine_error
    from deployments.embeddings.vllm_engine import map_pooling_error

    too_long = ValueError("This model's maximum context length is 64 tokens.")
    chat, pooling = map_engine_error(too_long), map_pooling_error(too_long)
    assert (chat.status_code, chat.code, chat.param) == (400, "context_length_exceeded", None)
    assert (pooling.status_code, pooling.code, pooling.param) == (
        400,
        "context_length_exceeded",
        "input",
    )
    # Only the pooling head counts a TypeError, and "max_model_len", as the caller's.
    assert map_engine_error(TypeError("x")).status_code == 502
    assert map_pooling_error(TypeError("x")).code == "invalid_value"
    over = ValueError("longer than max_model_len")
    assert map_engine_error(over).code is None
    assert map_pooling_error(over).code == "context_length_exceeded"
    crash = RuntimeError("boom")
    for mapped in (map_engine_error(crash), map_pooling_error(crash)):
        assert (mapped.status_code, mapped.message) == (502, "The model engine failed: boom")


def test_chat_and_pooling_configs_share_the_engine_settings() -> None:
    """``VLLMHeadConfig``'s fields translate alike for both heads; each keeps its own
    defaults (batch size, CPU KV cache) and adds its own args; ``engine_args`` win."""
    from deployments.chat.vllm_config import VLLMEngineConfig
    from deployments.embeddings.config import VLLMPoolingConfig

    shared = {"model": "/m", "dtype": "auto", "max_model_len": 32, "engine_args": {"seed": 7}}
    chat = VLLMEngineConfig(**shared).engine_kwargs("cpu", "/m")
    pooling = VLLMPoolingConfig(**shared).engine_kwargs("cpu", "/m", "emb")
    for kwargs in (chat, pooling):
        assert kwargs["dtype"] == "float32" and kwargs["enforce_eager"] is True
        assert (kwargs["max_model_len"], kwargs["seed"]) == (32, 7)
    assert (chat["max_num_seqs"], pooling["max_num_seqs"]) == (4, 64)
    assert (chat["kv_cache_memory_bytes"], pooling["kv_cache_memory_bytes"]) == (
        256 << 20,
        64 << 20,
    )
    assert (chat["served_model_name"], pooling["served_model_name"]) == ("/m", "emb")
    assert pooling["runner"] == "pooling" and "runner" not in chat
    assert "kv_cache_memory_bytes" not in VLLMEngineConfig(model="/m").engine_kwargs("cuda", "/m")
    with pytest.raises(ValueError, match="max_model_len"):
        VLLMEngineConfig(model="/m", max_model_len=8)  # the chat head's bound is 16
    assert VLLMPoolingConfig(model="/m", max_model_len=8).max_model_len == 8
