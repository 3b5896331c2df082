"""``gateway users set-password`` and ``gateway users login-link``."""

from __future__ import annotations

import io
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from serve_app.auth.accounts import AccountStore
from serve_app.auth.sessions import SessionStore
from serve_app.cli import main
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database


@pytest.fixture
def settings(tmp_path: Path) -> GatewaySettings:
    return GatewaySettings(database_url=f"sqlite:///{tmp_path / 'gw.db'}", state_dir=tmp_path)


@pytest.fixture
def store(settings: GatewaySettings) -> SessionStore:
    db = Database.from_settings(settings)
    db.migrate()
    accounts = AccountStore(db)
    accounts.set_membership("alice", "acme", "admin")
    return SessionStore(db, accounts, ttl_s=600)


def test_set_password_reads_stdin_and_ends_sessions(
    settings: GatewaySettings,
    store: SessionStore,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    user_id = store.set_password("alice", "first password")
    token, _ = store.start(user_id)
    monkeypatch.setattr("sys.stdin", io.StringIO("second password\n"))
    assert main(["users", "set-password", "alice"], settings=settings) == 0
    assert "alice" in capsys.readouterr().out
    assert store.check_password("alice", "second password") == user_id
    assert store.check_password("alice", "first password") is None
    assert store.lookup(token) is None


def test_set_password_refuses_a_short_one_and_an_unknown_user(
    settings: GatewaySettings,
    store: SessionStore,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert main(["users", "set-password", "alice"], settings=settings) != 0
    monkeypatch.setattr("sys.stdin", io.StringIO("long enough password\n"))
    assert main(["users", "set-password", "nobody"], settings=settings) != 0
    assert store.check_password("alice", "short") is None


def test_login_link_prints_a_single_use_link(
    settings: GatewaySettings, store: SessionStore, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["users", "login-link", "alice", "--base-url", "https://gw.example.com/"]
    assert main(argv, settings=settings) == 0
    link = urlparse(capsys.readouterr().out.strip())
    assert (link.scheme, link.netloc, link.path) == (
        "https",
        "gw.example.com",
        "/dashboard/login/token",
    )
    token = parse_qs(link.query)["token"][0]
    user = store.redeem_login_token(token)
    assert user is not None and store.redeem_login_token(token) is None
