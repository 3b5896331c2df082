"""The vLLM comparison bench's set-up: its config, its process accounting, its server flags.

The bench itself needs two engines and minutes; these check the pieces that
decide whether its figures compare like with like.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from bench import proc_cpu, servers
from bench.common import Series
from bench.gateway_stack import REPO, Variant
from bench.vs_vllm import ENGINE, MODEL, compare, gateway_config, parse_args
from serve_app.cli import build_parser
from serve_app.cli import serve as serve_cli
from serve_app.config import GatewayAppArgs


def test_the_gateway_config_serves_the_smollm2_chat_head_alone(tmp_path: Path) -> None:
    config = yaml.safe_load(gateway_config(tmp_path / "g.yaml").read_text())
    local = yaml.safe_load(Path("configs/local.yaml").read_text())
    (app,) = config["applications"]
    args = GatewayAppArgs.model_validate(app["args"])
    assert [(m.id, m.head) for m in args.catalog] == [(MODEL, "chat")]
    engine = args.catalog[0].engine.config
    assert {k: engine[k] for k in ENGINE} == ENGINE
    assert engine["model"] == f"prepared:{MODEL}"  # the folder vLLM's server loads too
    # Everything but the catalog is the local config's, so the gateway measured is that one.
    local_args = local["applications"][0]["args"]
    assert app["args"]["ingress"] == local_args["ingress"]
    assert app["args"]["dedicated"] == local_args["dedicated"]
    assert "catalog_files" not in app["args"]


def test_overrides_merge_into_the_application_args(tmp_path: Path) -> None:
    overrides = {"readiness_refresh_s": 9.0, "timeouts": {"idle_s": 5}}
    config = yaml.safe_load(gateway_config(tmp_path / "g.yaml", overrides).read_text())
    args = config["applications"][0]["args"]
    assert args["readiness_refresh_s"] == 9.0
    assert args["timeouts"] == {"first_event_s": 120, "idle_s": 5}  # merged, not replaced


def test_quick_shrinks_only_the_figures_not_given() -> None:
    quick = parse_args(["--quick", "--idle-s", "20"])
    assert (quick.requests, quick.tokens, quick.concurrency, quick.idle_s) == (3, 8, [4], 20.0)
    full = parse_args(["--concurrency", "8,16"])
    assert (full.requests, full.tokens, full.rounds, full.concurrency) == (20, 32, 3, [8, 16])


def test_the_bare_server_gets_the_same_engine_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def popen(cmd: list[str], **kwargs: Any) -> object:
        seen["cmd"], seen["kwargs"] = cmd, kwargs
        return object()

    monkeypatch.setattr(servers.subprocess, "Popen", popen)
    servers.start_vllm(tmp_path, 1234, tmp_path / "log", ENGINE)
    cmd = " ".join(seen["cmd"])
    assert "-m vllm.entrypoints.openai.api_server" in cmd
    for flag in ("--dtype float32", "--max-model-len 2048", "--max-num-seqs 16"):
        assert flag in cmd
    assert f"--kv-cache-memory-bytes {256 * 1024**2}" in cmd and "--enforce-eager" in cmd
    assert "--block-size 32" in cmd  # engine_args pass through by vLLM's own names
    assert seen["kwargs"]["start_new_session"] is True
    with pytest.raises(ValueError, match="no vLLM server flag"):
        servers.start_vllm(tmp_path, 1234, tmp_path / "log", {"swap_space": 4})


@pytest.mark.parametrize(
    ("cmdline", "below_head", "role"),
    [
        ("ray::ProxyActor", False, "proxy"),
        ("ray::ServeReplica:gateway:Gateway", False, "gateway"),
        ("ray::ServeReplica:gateway:chat-smollm2-135m-instruct", False, "head"),
        ("VLLM::EngineCore", True, "engine"),
        ("ray::ServeController", False, "serve controller"),
        (".../ray/core/src/ray/raylet/raylet --x", False, "ray and driver"),
    ],
)
def test_gateway_processes_get_their_roles(cmdline: str, below_head: bool, role: str) -> None:
    assert proc_cpu.gateway_role(cmdline, below_head) == role


def test_cpu_time_is_read_per_process_and_a_tree_is_stopped_whole() -> None:
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "while time.process_time() < 0.3: pass\n"  # CPU time, however loaded the box is
        "print('spent', flush=True)\n"
        "time.sleep(60)\n"
    )
    root = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert root.stdout is not None and root.stdout.readline() == b"spent\n"
        procs = proc_cpu.classify(root.pid, "bare")
        assert [p.role for p in procs] == ["api server", "engine"]
        zero = dict.fromkeys((p.pid for p in procs), 0.0)
        spent = proc_cpu.by_role(procs, zero, proc_cpu.snapshot(procs))
        assert spent["api server"] >= 0.25  # ticks of 10 ms, sampled: a little under
        assert spent["engine"] < spent["api server"]
    finally:
        servers.stop_tree(root, grace_s=5)
    assert root.poll() is not None
    assert not any(_alive(p.pid) for p in procs)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_gateway_run_starts_its_own_ray_and_can_leave_the_dashboard_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    # setenv first: it records the variable's original state, so teardown also removes the
    # value _start_ray sets (a delenv of an absent variable alone would restore nothing).
    monkeypatch.setenv("RAY_SERVE_METRICS_EXPORT_INTERVAL_MS", "")
    monkeypatch.delenv("RAY_SERVE_METRICS_EXPORT_INTERVAL_MS")
    for argv in (["run"], ["run", "--no-dashboard"]):
        serve_cli._start_ray(build_parser().parse_args(argv))
    assert [c["address"] for c in calls] == ["local", "local"]  # never a stranger's cluster
    assert [c["include_dashboard"] for c in calls] == [True, False]
    assert os.environ["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"] == "1000"


def test_ray_settings_the_operator_gave_win_over_gateway_runs_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    monkeypatch.setattr(ray, "init", lambda **kwargs: None)
    monkeypatch.setenv("RAY_SERVE_METRICS_EXPORT_INTERVAL_MS", "100")
    serve_cli._start_ray(build_parser().parse_args(["run"]))
    assert os.environ["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"] == "100"


def test_a_variant_is_a_label_with_environment_settings_and_maybe_another_checkout(
    tmp_path: Path,
) -> None:
    (tmp_path / "serve_app").mkdir()
    args = parse_args(["--variant", f"t0:A=1,B=x=y,repo={tmp_path}", "--variant", "plain:"])
    first, second = args.variant
    assert (first.label, first.env, first.repo) == ("t0", {"A": "1", "B": "x=y"}, tmp_path)
    assert (second.label, second.env, second.repo) == ("plain", {}, REPO)
    for bad in ("nolabel", "gateway:A=1", "x:A", f"x:repo={tmp_path / 'nothing'}"):
        with pytest.raises(argparse.ArgumentTypeError):
            Variant.parse(bad)


def test_each_gateway_stack_is_compared_with_the_same_bare_calls() -> None:
    def series(seconds: float) -> Series:
        return Series(latency=[seconds] * 3, ttft=[seconds / 10] * 3, tokens=96)

    seq = {
        "bare json": series(1.0),
        "bare stream": series(1.0),
        "gateway[v] json": series(1.5),
        "gateway[v] stream": series(2.0),
    }
    rounds = {"32": {"bare": [100.0, 100.0], "gateway[v]": [90.0, 80.0]}}
    figures = compare(seq, rounds, "gateway[v]")
    assert figures["latency"]["non-streamed"]["added_ms"]["p50"] == 500.0
    assert figures["latency"]["streamed"]["ratio"]["p50"] == 2.0
    assert figures["latency"]["ttft"]["added_ms"]["p50"] == 100.0
    assert figures["tokens_per_s"]["32"]["ratio"] == 0.85
    assert figures["tokens_per_s"]["32"]["ratio_per_round"] == [0.9, 0.8]
