"""Where `gateway run` and /api/admin/ray-dashboard say Ray's dashboard token is."""

from __future__ import annotations

from pathlib import Path

from serve_app.ray_dashboard import DEFAULT_URL, ray_dashboard, startup_lines, token_hint


def test_the_hint_follows_ray_s_own_lookup_order(tmp_path: Path) -> None:
    assert "RAY_AUTH_TOKEN environment" in token_hint({"RAY_AUTH_TOKEN": "x"}, tmp_path)
    assert "/etc/tok" in token_hint({"RAY_AUTH_TOKEN_PATH": "/etc/tok"}, tmp_path)
    default = token_hint({}, tmp_path)
    assert str(tmp_path / ".ray" / "auth_token") in default and "get-auth-token" in default
    assert "off" in token_hint({"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "x"}, tmp_path)


def test_the_url_is_the_one_gateway_run_set() -> None:
    assert ray_dashboard({}).url == DEFAULT_URL
    assert ray_dashboard({"GATEWAY_RAY_DASHBOARD_URL": "http://h:1"}).url == "http://h:1"
    assert "x" not in ray_dashboard({"RAY_AUTH_TOKEN": "x"}).token_hint.split()


def test_gateway_run_prints_where_the_token_is_on_its_own_lines(tmp_path: Path) -> None:
    url = "http://127.0.0.1:8265"
    lines = startup_lines(url, {}, tmp_path)
    assert url in lines[0]
    token_line = next(line for line in lines if "token is" in line)
    assert str(tmp_path / ".ray" / "auth_token") in token_line
    assert ".venv/bin/ray get-auth-token" in token_line
    assert "/etc/tok" in " ".join(startup_lines(url, {"RAY_AUTH_TOKEN_PATH": "/etc/tok"}))
    secret = startup_lines(url, {"RAY_AUTH_TOKEN": "s3cret"})
    assert "RAY_AUTH_TOKEN" in " ".join(secret) and "s3cret" not in " ".join(secret)
    assert len(startup_lines(url, {"RAY_AUTH_MODE": "disabled"})) == 1
