"""Starting ``gateway run`` for the benchmarks: the SmolLM2-only config, keys, readiness.

Shared by ``vs_vllm.py`` (the headline bench), ``idle_cpu.py`` and
``profile_stream.py``, so all three measure the same stack started the same way.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import free_port
from bench.servers import SMOLLM2, mint_key
from deployments.vllm_start import scoped_environ

REPO = Path(__file__).resolve().parent.parent
MODEL = SMOLLM2
ENGINE: dict[str, object] = {
    "dtype": "float32",
    "max_model_len": 2048,
    "max_num_seqs": 16,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 256 * 1024**2,
    "engine_args": {"block_size": 32},  # the catalog's (configs/catalog/local.yaml)
}
"""Engine settings of both stacks, in the catalog's names (bench.servers maps them to flags)."""
BASE_CONFIG = "configs/local.yaml"
READY_LINE = b"] gateway ready on"


def gateway_config(
    target: Path,
    overrides: dict[str, Any] | None = None,
    repo: Path = REPO,
    *,
    model: str = MODEL,
    head: str = "chat",
    engine: dict[str, object] | None = None,
    deployment: dict[str, Any] | None = None,
) -> Path:
    """configs/local.yaml with its catalog files replaced by one entry alone (SmolLM2's chat).

    The entry (``model`` of head kind ``head``) is copied from the catalog file the config
    names (so the head runs with its real deployment options) and its engine settings
    pinned to ``engine`` (default ``ENGINE``); ``deployment`` replaces its deployment
    options where given (a bench pins one replica instead of a sleeping head's autoscaling).
    ``overrides`` replaces top-level keys of the application's ``args`` (a dict value
    is merged one level down: ``{"ledger": {"flush_interval_s": 5}}``). ``repo`` is the
    checkout whose config is read: an older checkout (a ``--variant repo=``) validates
    its own config schema, which this one's keys would not pass.
    """
    config = yaml.safe_load((repo / BASE_CONFIG).read_text()) or {}
    apps = [a for a in config["applications"] if a["import_path"].startswith("serve_app.builders")]
    if len(apps) != 1:
        raise SystemExit(f"{BASE_CONFIG}: expected one gateway application, found {len(apps)}")
    app = apps[0]
    args = dict(app.get("args") or {})
    entries = list(args.pop("catalog", []))
    for name in args.pop("catalog_files", []):
        entries += (yaml.safe_load((repo / name).read_text()) or {}).get("models", [])
    found = [e for e in entries if e.get("id") == model and e.get("head") == head]
    if not found:
        raise SystemExit(f"{BASE_CONFIG}: no {head} entry '{model}' in its catalog")
    entry = dict(found[0])
    pinned = ENGINE if engine is None else engine
    entry["engine"] = {**entry["engine"], "config": {**entry["engine"]["config"], **pinned}}
    if deployment is not None:
        entry["deployment"] = deployment
    args["catalog"] = [entry]
    for name, value in (overrides or {}).items():
        merge = isinstance(value, dict) and isinstance(args.get(name), dict)
        args[name] = {**args[name], **value} if merge else value
    config["applications"] = [{**app, "args": args}]
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def start_gateway(
    config: Path,
    port: int,
    work: Path,
    models_dir: Path,
    extra_args: list[str],
    env_extra: dict[str, str] | None = None,
    repo: Path = REPO,
) -> tuple[subprocess.Popen[bytes], str]:
    """``gateway run`` on ``config`` in its own session, with its own state, DB and Ray dir.

    ``env_extra`` is added to its environment; ``repo`` is the checkout whose code runs.
    """
    state = work / "state"
    state.mkdir(parents=True)
    env = {
        **os.environ,
        "GATEWAY_STATE_DIR": str(state),
        "GATEWAY_DATABASE_URL": f"sqlite:///{state}/gateway.db",
        "GATEWAY_MODELS_DIR": str(models_dir),
        # Ray's temp dir, so ray.init cannot find (and join) a cluster someone else started.
        "RAY_TMPDIR": str(work / "r"),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Only ``repo`` on the path: another checkout's PYTHONPATH must not win over it.
        "PYTHONPATH": str(repo),
        **(env_extra or {}),
    }
    env.pop("RAY_ADDRESS", None)
    key = _mint_key_in(env)
    cmd = [sys.executable, "-m", "serve_app.cli", "run", "--config", str(config)]
    cmd += ["--port", str(port), "--dashboard-port", str(free_port()), *extra_args]
    log = (work / "gateway.log").open("wb")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=repo, start_new_session=True
    )
    return proc, key


@dataclass(frozen=True)
class Variant:
    """One more gateway stack (``--variant LABEL:SPEC``): its environment and checkout."""

    label: str
    env: dict[str, str]
    repo: Path = REPO

    @classmethod
    def parse(cls, text: str) -> Variant:
        label, sep, spec = text.partition(":")
        if not sep or not label or label == "gateway":
            raise argparse.ArgumentTypeError(f"expected LABEL:NAME=VALUE,..., got {text!r}")
        env: dict[str, str] = {}
        repo = REPO
        for item in filter(None, spec.split(",")):
            name, eq, value = item.partition("=")
            if not eq:
                raise argparse.ArgumentTypeError(f"{item!r} in {text!r} is not NAME=VALUE")
            if name == "repo":
                repo = Path(value).resolve()
                if not (repo / "serve_app").is_dir():
                    raise argparse.ArgumentTypeError(f"{repo} is not a checkout of the gateway")
            else:
                env[name] = value
        return cls(label, env, repo)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.env.items()]
        if self.repo != REPO:
            parts.append(f"repo={self.repo}")
        return ", ".join(parts) or "(same as gateway)"


def _mint_key_in(env: dict[str, str]) -> str:
    with scoped_environ({k: v for k, v in env.items() if k.startswith("GATEWAY_")}):
        return mint_key(env["GATEWAY_DATABASE_URL"])


def wait_gateway(
    base_url: str,
    key: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    timeout_s: float,
    probe: tuple[str, dict[str, Any]] | None = None,
) -> None:
    """Wait for ``gateway run``'s "ready" line, then for an answer (``wait_answering``).

    A head can answer before Serve reports the application running; the gateway's
    readiness poll then turns it back to "warming" (503) for a while, so the first
    200 alone is not the stack's steady state.
    """
    deadline = time.monotonic() + timeout_s
    while READY_LINE not in log.read_bytes():
        if proc.poll() is not None:
            raise RuntimeError(f"gateway run exited with {proc.returncode} while starting")
        if time.monotonic() > deadline:
            raise TimeoutError(f"gateway run was not ready within {timeout_s:.0f} s")
        time.sleep(2)
    wait_answering(base_url, key, proc, deadline - time.monotonic(), "gateway run", probe)


def wait_answering(
    base_url: str,
    key: str,
    proc: subprocess.Popen[bytes],
    timeout_s: float,
    what: str,
    probe: tuple[str, dict[str, Any]] | None = None,
) -> None:
    """Poll ``probe`` (path, JSON body; default a SmolLM2 chat completion) until it answers
    200 (heads answer 503 while warming)."""
    deadline = time.monotonic() + timeout_s
    path, body = probe or (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    headers = {"Authorization": f"Bearer {key}"}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting")
        try:
            url = f"{base_url}{path}"
            if httpx.post(url, json=body, headers=headers, timeout=60).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{what} did not answer within {timeout_s:.0f} s")
