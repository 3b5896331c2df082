"""The ``gateway`` account commands, in-process and as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.auth.accounts import AccountStore
from serve_app.auth.keys import looks_like_key
from serve_app.auth.principal import Principal
from serve_app.auth.service import AuthService
from serve_app.cli import main
from serve_app.protocol.errors import AuthenticationError
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database

REPO_ROOT = Path(__file__).resolve().parents[2]
PEPPER = "cli-pepper"


@pytest.fixture
def settings(database_url: str) -> GatewaySettings:
    return GatewaySettings(database_url=database_url, key_pepper=PEPPER, auth_cache_seconds=0)


@pytest.fixture
def auth(settings: GatewaySettings) -> Iterator[AuthService]:
    db = Database.from_settings(settings)
    yield AuthService(AccountStore(db, pepper=PEPPER), settings)
    db.dispose()


def gateway(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings | None, *argv: str
) -> tuple[int, str, str]:
    code = main(list(argv), settings=settings)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def create_key(capsys: pytest.CaptureFixture[str], settings: GatewaySettings, *extra: str) -> str:
    code, out, err = gateway(capsys, settings, "keys", "create", *extra)
    assert code == 0, err
    return out.strip().splitlines()[-1]


def who(auth: AuthService, raw: str) -> Principal:
    return auth.authenticate(f"Bearer {raw}")


def test_keys_create_prints_only_the_key_on_stdout(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings, auth: AuthService
) -> None:
    code, out, err = gateway(
        capsys, settings, "keys", "create", "--user", "alice", "--org", "acme",
        "--role", "admin", "--scopes", "inference",
    )  # fmt: skip
    assert code == 0
    assert out.endswith("\n") and len(out.splitlines()) == 1
    raw = out.strip()
    assert looks_like_key(raw)
    assert "alice" in err
    principal = who(auth, raw)
    assert principal.role == "admin"
    assert principal.scopes == frozenset({"inference"})


def test_bad_scopes_exit_1_with_a_clear_error(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings
) -> None:
    code, out, err = gateway(
        capsys, settings, "keys", "create", "--user", "a", "--org", "o", "--scopes", "everything"
    )
    assert code == 1
    assert out == ""
    assert err.startswith("error: Invalid scopes ['everything']")
    assert "Traceback" not in err


def test_keys_list_shows_ids_and_prefixes_never_keys(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings
) -> None:
    raw = create_key(capsys, settings, "--user", "alice", "--org", "acme")
    code, out, _ = gateway(capsys, settings, "keys", "list", "--user", "alice")
    assert code == 0
    assert raw[4:12] + "..." in out
    assert "key_" in out and "acme" in out and "active" in out
    assert raw not in out and raw[4:] not in out
    assert gateway(capsys, settings, "keys", "list", "--user", "nobody")[0] == 1


def test_keys_revoke_by_key_and_by_id(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings, auth: AuthService
) -> None:
    first = create_key(capsys, settings, "--user", "alice", "--org", "acme")
    second = create_key(capsys, settings, "--user", "alice", "--org", "acme")
    assert gateway(capsys, settings, "keys", "revoke", first)[0] == 0
    with pytest.raises(AuthenticationError, match="revoked"):
        who(auth, first)
    code, _, err = gateway(capsys, settings, "keys", "revoke", first)
    assert code == 1 and "already revoked" in err

    _, listing, _ = gateway(capsys, settings, "keys", "list", "--user", "alice")
    active_id = next(line.split()[0] for line in listing.splitlines() if line.endswith("active"))
    assert gateway(capsys, settings, "keys", "revoke", active_id)[0] == 0
    with pytest.raises(AuthenticationError):
        who(auth, second)


def test_users_update_changes_limits_and_flags(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings, auth: AuthService
) -> None:
    raw = create_key(capsys, settings, "--user", "alice", "--org", "acme")
    code, out, _ = gateway(
        capsys, settings, "users", "update", "alice", "--rpm", "30", "--daily-tokens", "5000",
        "--web-search", "on", "--code-interpreter", "on",
    )  # fmt: skip
    assert code == 0
    assert "rpm=30" in out and "web_search=on" in out and "web_fetch=off" in out
    assert gateway(capsys, settings, "users", "update", "alice", "--rpm", "0")[0] == 0
    principal = who(auth, raw)
    assert principal.user_limits.rpm is None
    assert principal.user_limits.daily_tokens == 5000
    assert principal.web_search_enabled and principal.code_interpreter_enabled
    assert not principal.web_fetch_enabled


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["users", "update", "alice"], 1, "nothing to update"),
        (["users", "update", "nobody", "--rpm", "1"], 1, "No user named 'nobody'"),
        (["users", "update", "alice", "--web-search", "maybe"], 2, "expected 'on' or 'off'"),
        (["users", "update", "alice", "--tpm", "-3"], 2, "0 (clear) or a positive"),
        (["orgs", "update", "nowhere", "--internal", "on"], 1, "No org named 'nowhere'"),
    ],
)
def test_update_errors(
    capsys: pytest.CaptureFixture[str],
    settings: GatewaySettings,
    argv: list[str],
    status: int,
    message: str,
) -> None:
    create_key(capsys, settings, "--user", "alice", "--org", "acme")
    code, _, err = gateway(capsys, settings, *argv)
    assert code == status
    assert message in err
    assert "Traceback" not in err


def test_orgs_update_changes_flags(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings, auth: AuthService
) -> None:
    raw = create_key(capsys, settings, "--user", "alice", "--org", "acme")
    code, out, _ = gateway(capsys, settings, "orgs", "update", "acme", "--external-providers", "on")
    assert code == 0 and "external_providers=on internal=off" in out
    principal = who(auth, raw)
    assert principal.external_providers_enabled and not principal.org_internal


def test_targets_may_also_be_named_by_option(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings, auth: AuthService
) -> None:
    """``users update --user U`` and ``orgs update --org O`` (the spelling of ``keys
    create``) work like the positional forms; ``keys revoke --key K`` too."""
    raw = create_key(capsys, settings, "--user", "alice", "--org", "acme")
    code, out, _ = gateway(
        capsys, settings, "users", "update", "--user", "alice", "--tpm", "99", "--web-fetch", "on"
    )
    assert code == 0 and "tpm=99" in out and "web_fetch=on" in out
    code, out, _ = gateway(
        capsys, settings, "orgs", "update", "--org", "acme", "--external-providers", "on"
    )
    assert code == 0 and "external_providers=on" in out
    principal = who(auth, raw)
    assert principal.user_limits.tpm == 99 and principal.external_providers_enabled
    assert gateway(capsys, settings, "keys", "revoke", "--key", raw)[0] == 0
    with pytest.raises(AuthenticationError, match="revoked"):
        who(auth, raw)


@pytest.mark.parametrize(
    "argv",
    [
        ["users", "update", "--rpm", "1"],
        ["users", "update", "alice", "--user", "bob", "--rpm", "1"],
        ["orgs", "update", "--internal", "on"],
        ["keys", "revoke"],
    ],
)
def test_missing_or_doubled_target_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings, argv: list[str]
) -> None:
    code, _, err = gateway(capsys, settings, *argv)
    assert code == 2 and "usage:" in err


def test_db_migrate_reports_what_it_did(
    capsys: pytest.CaptureFixture[str], settings: GatewaySettings
) -> None:
    code, out, _ = gateway(capsys, settings, "db", "migrate")
    assert code == 0 and out.startswith("Applied migrations 1")
    code, out, _ = gateway(capsys, settings, "db", "migrate")
    assert code == 0 and "up to date" in out


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["keys"],
        ["keys", "create"],
        ["keys", "revoke"],
        ["keys", "list"],
        ["users"],
        ["users", "update"],
        ["orgs"],
        ["orgs", "update"],
        ["db"],
        ["db", "migrate"],
    ],
)
def test_help_exits_0(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    code, out, _ = gateway(capsys, None, *command, "--help")
    assert code == 0
    assert out.startswith(f"usage: gateway {' '.join(command)}".rstrip())


def test_missing_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = gateway(capsys, None, "keys")
    assert code == 2
    assert "required" in err


def run_module(database_url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_KEY_PEPPER": PEPPER,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-m", "serve_app.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )


def test_console_entry_point_in_a_subprocess(database_url: str, auth: AuthService) -> None:
    created = run_module(database_url, "keys", "create", "--user", "sub", "--org", "proc")
    assert created.returncode == 0, created.stderr
    raw = created.stdout.splitlines()[-1]
    assert who(auth, raw).scopes

    failed = run_module(database_url, "keys", "revoke", "key_unknown")
    assert failed.returncode == 1
    assert failed.stderr.startswith("error: no active key")
    assert "Traceback" not in failed.stderr
