"""Servers the benchmarks start and stop: vLLM's own OpenAI server, API keys, process trees.

Shared by ``proxy_compare.py`` (bare vLLM next to LiteLLM and the gateway) and
``vs_vllm.py`` (bare vLLM against ``gateway run``), so both start the bare
server the same way and clean up the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import psutil

from deployments.vllm_start import cpu_engine_env

SMOLLM2 = "smollm2-135m-instruct"

ENGINE_FLAGS = {
    "dtype": "--dtype",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
}
"""Engine settings (the catalog's ``engine.config`` names) -> vLLM server flags."""


def start_vllm(
    model_path: Path,
    port: int,
    log: Path,
    engine: Mapping[str, object],
    served_name: str = SMOLLM2,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """vLLM's OpenAI server (``python -m``: the ``vllm`` console script is broken here).

    ``engine`` uses the catalog's names (``max_model_len``, ``enforce_eager``...), so
    a bench can hand the same dict to the gateway's head and to this server.
    ``extra_args`` go to the server as they are (``--runner pooling``).
    The server runs in its own session: Ctrl-C in the terminal reaches the bench,
    which then stops the server in order (``stop_tree``).
    """
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_path),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-log-stats",  # its periodic stats line; the access log stays on (default)
        *extra_args,
    ]
    for name, value in engine.items():
        if name == "enforce_eager":
            cmd += ["--enforce-eager"] if value else []
        elif name == "engine_args":  # the catalog's pass-through to vLLM: its own names
            for arg, setting in dict(value).items():  # type: ignore[call-overload]
                cmd += [f"--{arg.replace('_', '-')}", str(setting)]
        elif name in ENGINE_FLAGS:
            cmd += [ENGINE_FLAGS[name], str(value)]
        else:
            raise ValueError(f"no vLLM server flag known for engine setting {name!r}")
    # The heads' CPU thread setting (deployments/vllm_start.py), so both stacks run alike.
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    env.update(cpu_engine_env(env))
    return subprocess.Popen(
        cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def mint_key(database_url: str, user: str = "bench", org: str = "bench") -> str:
    """An API key in the gateway's database, as ``gateway keys create`` makes it.

    Reads the pepper from the same settings the gateway reads, so a key minted
    here verifies in a gateway started with the same ``GATEWAY_*`` environment.
    """
    from serve_app.auth.accounts import AccountStore
    from serve_app.settings import GatewaySettings
    from serve_app.storage.db import Database

    database = Database(database_url)
    try:
        database.migrate()
        pepper = GatewaySettings().key_pepper
        return AccountStore(database, pepper=pepper).create_key(user, org)
    finally:
        database.dispose()


def descendants(pid: int) -> list[psutil.Process]:
    """``pid`` and every process below it (an empty list once it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def stop_tree(
    proc: subprocess.Popen[bytes],
    first: signal.Signals = signal.SIGTERM,
    grace_s: float = 30.0,
    known: Iterable[psutil.Process] = (),
) -> None:
    """Ask ``proc`` to stop with ``first``, then kill whatever of its tree is left.

    ``known`` adds processes seen earlier (a Ray worker whose parent died is no
    longer below ``proc``). psutil refuses to signal a pid reused by another
    process, so a stale entry is harmless.
    """
    tree = {p.pid: p for p in (*known, *descendants(proc.pid))}
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(first)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    tree.update({p.pid: p for p in descendants(proc.pid)})
    for process in tree.values():
        with contextlib.suppress(psutil.Error):
            process.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the session start_new_session gave it
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    psutil.wait_procs(list(tree.values()), timeout=10)
