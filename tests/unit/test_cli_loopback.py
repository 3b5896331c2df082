"""The loopback stand-in provider of ``gateway run``: key kept, reused, re-minted; URL env."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from serve_app.auth.accounts import AccountStore
from serve_app.catalog.config import CatalogModel
from serve_app.cli import loopback
from serve_app.cli.serve import first_answer_model, prepared_models, uses_loopback_provider
from serve_app.cli.serve_config import load_serve_config
from serve_app.heads.external import ExternalHeadClient
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database


@pytest.fixture
def settings(tmp_path: Path) -> GatewaySettings:
    return GatewaySettings(state_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'gw.db'}")


def _principal_user(settings: GatewaySettings, raw: str) -> str | None:
    db = Database.from_settings(settings)
    try:
        store = AccountStore(db, pepper=settings.key_pepper)
        principal = store.principal_for_hash(store.hash(raw))
        if principal is None:
            return None
        owner = store.get_user(loopback.LOOPBACK_ACCOUNT)
        return loopback.LOOPBACK_ACCOUNT if owner and owner.id == principal.user_id else "other"
    finally:
        db.dispose()


def test_the_key_is_minted_once_kept_private_and_reused(settings: GatewaySettings) -> None:
    first = loopback.ensure_loopback_key(settings)
    path = settings.state_dir / loopback.KEY_FILE
    assert path.read_text().strip() == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _principal_user(settings, first) == loopback.LOOPBACK_ACCOUNT
    assert loopback.ensure_loopback_key(settings) == first


def test_a_revoked_or_foreign_key_is_replaced(settings: GatewaySettings) -> None:
    first = loopback.ensure_loopback_key(settings)
    db = Database.from_settings(settings)
    try:
        assert AccountStore(db, pepper=settings.key_pepper).revoke_key(first)
    finally:
        db.dispose()
    second = loopback.ensure_loopback_key(settings)
    assert second != first and _principal_user(settings, second) == loopback.LOOPBACK_ACCOUNT
    (settings.state_dir / loopback.KEY_FILE).write_text("sk-not-a-key-of-this-database\n")
    third = loopback.ensure_loopback_key(settings)
    assert third not in (first, second) and _principal_user(settings, third) is not None


def test_prepare_exports_key_and_url_but_keeps_what_the_caller_set(
    settings: GatewaySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (loopback.KEY_ENV, loopback.BASE_URL_ENV):
        # setenv first: delenv of an absent variable records nothing to restore, and the
        # value prepare_loopback_provider sets would leak into later tests.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    loopback.prepare_loopback_provider(settings, "0.0.0.0", 9123)
    assert os.environ[loopback.BASE_URL_ENV] == "http://127.0.0.1:9123/v1"
    assert _principal_user(settings, os.environ[loopback.KEY_ENV]) == loopback.LOOPBACK_ACCOUNT
    monkeypatch.setenv(loopback.KEY_ENV, "sk-operator-choice")
    monkeypatch.setenv(loopback.BASE_URL_ENV, "http://10.0.0.5:8000/v1")
    loopback.prepare_loopback_provider(settings, "127.0.0.1", 8000)
    assert os.environ[loopback.KEY_ENV] == "sk-operator-choice"
    assert os.environ[loopback.BASE_URL_ENV] == "http://10.0.0.5:8000/v1"


def test_the_local_config_declares_the_loopback_model() -> None:
    config = load_serve_config("configs/local.yaml")
    assert uses_loopback_provider(config)
    # The external entry adds none; the vision demo is built on SmolLM2 at first start,
    # the reasoning demo with Qwen2.5-Coder-0.5B's tokenizer (prepared with it), the JSON
    # LoRA adapter trained on SmolLM2.
    assert sorted(prepared_models(config)) == [
        "qwen2.5-coder-1.5b-instruct",
        "qwen3-tiny",
        "smollm2-135m-instruct",
        "smollm2-json-lora",
        "smolvlm-tiny",
    ]
    # Only SmolLM2 is prepared before Ray starts; the 1.5B tool model (~90 s to convert)
    # and the demos follow in the background while their heads warm.
    assert first_answer_model(config) == "smollm2-135m-instruct"


def test_base_url_env_replaces_the_configured_url_only_when_set() -> None:
    model = CatalogModel.model_validate(
        {
            "id": "ext",
            "head": "chat",
            "context_length": 1024,
            "max_output_tokens": 64,
            "pricing": {"mode": "external"},
            "external": {
                "base_url": "https://fallback.example/v1",
                "base_url_env": "UPSTREAM_URL",
                "api_key_env": "UPSTREAM_KEY",
                "upstream_model": "m",
            },
        }
    )
    env = {"UPSTREAM_KEY": "k", "UPSTREAM_URL": "http://127.0.0.1:9/v1"}
    assert ExternalHeadClient(model, environ=env).base_url == "http://127.0.0.1:9/v1"
    empty = {"UPSTREAM_KEY": "k", "UPSTREAM_URL": ""}
    assert ExternalHeadClient(model, environ=empty).base_url == "https://fallback.example/v1"
