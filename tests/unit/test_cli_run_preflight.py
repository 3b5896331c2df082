"""``gateway run`` checks its config in a child process beside the start."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from serve_app.cli import CommandError
from serve_app.cli.serve import Preflight


def _config(tmp_path: Path, catalog: list[dict[str, object]]) -> str:
    app = {
        "name": "gateway",
        "import_path": "serve_app.builders:build_gateway_app",
        "args": {"catalog": catalog},
    }
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"applications": [app]}))
    return str(path)


def test_a_broken_config_stops_the_start_with_the_checks_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_STATE_DIR", str(tmp_path / "state"))
    broken = {
        "id": "no-such-backend",
        "head": "chat",
        "pricing": {"input_per_mtok": 1, "output_per_mtok": 1},
        "engine": {"backend": "nonexistent_module:Engine", "config": {}},
    }
    check = Preflight(_config(tmp_path, [broken]))
    with pytest.raises(CommandError, match="gateway check found problems"):
        check.require_ok()
    assert "no-such-backend" in capsys.readouterr().err


def test_a_sound_config_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_STATE_DIR", str(tmp_path / "state"))
    scripted = {
        "id": "scripted",
        "head": "chat",
        "context_length": 64,
        "max_output_tokens": 16,
        "pricing": {"input_per_mtok": 1, "output_per_mtok": 1},
        "engine": {"backend": "tests.fakes.scripted_engine:ScriptedEngine", "config": {}},
    }
    Preflight(_config(tmp_path, [scripted])).require_ok()
