"""``gateway check``: the shipped local config passes; each deliberate break is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from serve_app.cli import main
from serve_app.settings import GatewaySettings

CHAT = {
    "head": "chat",
    "context_length": 2048,
    "max_output_tokens": 256,
    "deployment": {"ray_actor_options": {"num_cpus": 0.1}},
}
BROKEN_CATALOG: list[dict[str, Any]] = [
    {
        **CHAT,
        "id": "bad-vllm-args",
        "engine": {
            "backend": "vllm",
            "config": {
                "model": "prepared:smollm2-135m-instruct",
                "engine_args": {"no_such_vllm_arg": 1, "max_num_seqs": "many"},
            },
        },
    },
    {
        **CHAT,
        "id": "bad-prepared",
        "engine": {"backend": "vllm", "config": {"model": "prepared:no-such-model"}},
    },
    {
        "id": "bad-backend",
        "head": "detect",
        "pricing": {"per_image": 0.001},
        "engine": {"backend": "no-such-backend", "config": {}},
    },
    {
        "id": "bad-class-backend",
        "head": "speech",
        "pricing": {"per_audio_second": 0.001},
        "engine": {"backend": "tests.no_such_module:Engine", "config": {}},
    },
    {
        "id": "bad-folder",
        "head": "parse",
        "pricing": {"per_image": 0.001},
        "engine": {"backend": "vision-encoder-decoder", "config": {"model": "/no/such/folder"}},
    },
    {
        "id": "bad-hub-offline",
        "head": "parse",
        "pricing": {"per_image": 0.001},
        "engine": {"backend": "pix2struct", "config": {"model": "example-org/not-cached-model"}},
    },
    {
        "id": "bad-tiny",
        "head": "parse",
        "pricing": {"per_image": 0.001},
        "engine": {"backend": "pix2struct", "config": {"model": "tiny:no-such-kind"}},
    },
    {
        "id": "bad-engine-config",
        "head": "transcription",
        "pricing": {"per_audio_second": 0.001},
        "engine": {"backend": "faster-whisper", "config": {"beam_size": 99}},
    },
]


@pytest.fixture
def settings(tmp_path: Path) -> GatewaySettings:
    # the budget explicit: its default, half this machine's memory, varies between machines
    return GatewaySettings(state_dir=tmp_path / "state", memory_budget=12)


def _write_config(tmp_path: Path, args: dict[str, Any]) -> str:
    app = {
        "name": "gateway",
        "route_prefix": "/",
        "import_path": "serve_app.builders:build_gateway_app",
        "args": args,
    }
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump({"applications": [app]}))
    return str(path)


def test_help_describes_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--help"]) == 0
    assert "--config" in capsys.readouterr().out


def test_the_local_config_passes(
    settings: GatewaySettings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what `gateway run` sets: nothing from a hub
    assert main(["check", "--config", "configs/local.yaml"], settings=settings) == 0, (
        capsys.readouterr().out
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "OK" in captured.err


def test_every_deliberate_break_is_named_with_its_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _write_config(tmp_path, {"deployment_mode": "production", "catalog": BROKEN_CATALOG})
    settings = GatewaySettings(
        state_dir=tmp_path / "state",
        database_url="postgresql+psycopg://gw:s3cret@127.0.0.1:1/gateway",
        redis_url="redis://127.0.0.1:1/0",
        object_store="s3",
        s3_bucket="videos",
        s3_endpoint_url="http://127.0.0.1:1",
        s3_region="us-east-1",
        s3_access_key_id="k",
        s3_secret_access_key="s",
    )
    assert main(["check", "--config", config, "--offline"], settings=settings) == 1
    lines = capsys.readouterr().out.splitlines()
    assert all(" -> fix: " in line for line in lines), lines

    def named(subject: str, *fragments: str) -> bool:
        return any(
            line.startswith(f"{subject}: ") and all(f in line for f in fragments) for line in lines
        )

    assert named("model bad-vllm-args", "no engine argument no_such_vllm_arg")
    assert named("model bad-vllm-args", "max_num_seqs='many'")
    assert named("model bad-prepared", "prepared:no-such-model is not a preparable model")
    assert named("model bad-backend", "'no-such-backend' is not a detect engine backend")
    assert named("model bad-class-backend", "cannot import tests.no_such_module")
    assert named("model bad-folder", "/no/such/folder does not exist")
    assert named("model bad-hub-offline", "example-org/not-cached-model is a hub id")
    assert named("model bad-tiny", "no tiny:no-such-kind builder")
    assert named("model bad-engine-config", "engine.config.beam_size")
    # production: a test engine and a random-weight model are refused, each on its own line
    assert named("model bad-class-backend", "production refuses it", "module:Class engine")
    assert named("model bad-tiny", "production refuses it", "random-weight tiny model")
    assert named("database", "127.0.0.1:1", "unreachable")
    assert not any("s3cret" in line for line in lines), "the password must not be printed"
    assert named("redis", "redis://127.0.0.1:1/0 is unreachable")
    assert named("object store", "S3 bucket videos is unreachable")
    # Production mode with a complete (if unreachable) environment: nothing refused.
    assert not any(line.startswith("environment: ") for line in lines)
    assert len(lines) == 14, "\n".join(lines)


def test_production_mode_names_each_missing_variable(
    tmp_path: Path, settings: GatewaySettings, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _write_config(tmp_path, {"deployment_mode": "production"})
    assert main(["check", "--config", config], settings=settings) == 1
    lines = capsys.readouterr().out.splitlines()
    refused = [line for line in lines if line.startswith("environment: ")]
    for name in ("GATEWAY_DATABASE_URL", "GATEWAY_REDIS_URL", "GATEWAY_OBJECT_STORE"):
        assert any(name in line for line in refused), lines
    assert len(lines) == 3, lines  # the SQLite file and the local folder themselves work


def test_production_names_an_external_model_without_its_key(
    tmp_path: Path,
    settings: GatewaySettings,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    external = {
        "id": "provider/chat",
        "head": "chat",
        "context_length": 1000,
        "max_output_tokens": 100,
        "pricing": {"mode": "external"},
        "external": {
            "base_url": "https://provider.example/v1",
            "api_key_env": "PROD15_TEST_PROVIDER_KEY",
            "upstream_model": "chat",
        },
    }
    config = _write_config(tmp_path, {"deployment_mode": "production", "catalog": [external]})
    monkeypatch.delenv("PROD15_TEST_PROVIDER_KEY", raising=False)
    main(["check", "--config", config], settings=settings)
    assert "model provider/chat: PROD15_TEST_PROVIDER_KEY is unset" in capsys.readouterr().out
    monkeypatch.setenv("PROD15_TEST_PROVIDER_KEY", "sk-test")
    main(["check", "--config", config], settings=settings)
    assert "PROD15_TEST_PROVIDER_KEY" not in capsys.readouterr().out


def test_invalid_args_are_reported_not_raised(
    tmp_path: Path, settings: GatewaySettings, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _write_config(tmp_path, {"ingress": {"num_replica": 2}})
    assert main(["check", "--config", config], settings=settings) == 1
    assert "args.ingress.num_replica" in capsys.readouterr().out


def test_gateway_run_stops_on_a_broken_config_with_the_checks_report(
    tmp_path: Path,
    settings: GatewaySettings,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check runs in a child beside the start (Ray and the deploy are stubbed here: the
    deploy of this config fails too, and the check's report is what the user sees)."""
    from serve_app.cli import serve

    steps: list[str] = []
    monkeypatch.setattr(serve, "_start_ray", lambda args: steps.append("ray started"))
    monkeypatch.setattr(serve, "_stop_ray", lambda: steps.append("ray stopped"))

    def deploy(serve_config: object, args: object) -> None:
        raise ValueError("no-such-backend: 'no-such-backend' is not a detect engine backend.")

    monkeypatch.setattr(serve, "_deploy", deploy)
    monkeypatch.setenv("GATEWAY_STATE_DIR", str(tmp_path / "state"))
    config = _write_config(tmp_path, {"catalog": BROKEN_CATALOG[2:3]})
    assert main(["run", "--config", config], settings=settings) == 1
    captured = capsys.readouterr()
    assert "'no-such-backend' is not a detect engine backend" in captured.err
    assert "--skip-check" in captured.err
    assert steps == ["ray started", "ray stopped"]
