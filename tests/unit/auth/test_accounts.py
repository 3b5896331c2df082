"""AccountStore on SQLite and PostgreSQL: keys, memberships, limits and flags."""

from __future__ import annotations

import pytest

from serve_app.auth.accounts import AccountStore
from serve_app.auth.principal import ALL_SCOPES, Principal, UserLimits
from serve_app.protocol.errors import InvalidRequestError, NotFoundError
from serve_app.storage.db import Database
from tests.fixtures.db import TEST_PEPPER


def principal_of(store: AccountStore, raw_key: str) -> Principal:
    principal = store.principal_for_hash(store.hash(raw_key))
    assert principal is not None
    return principal


def test_created_key_resolves_to_its_user_and_org(account_store: AccountStore) -> None:
    raw = account_store.create_key("alice", "acme")
    principal = principal_of(account_store, raw)
    assert principal.user_id == account_store.ensure_user("alice")
    assert principal.org_id == account_store.ensure_org("acme")
    assert principal.role == "member"
    assert principal.scopes == ALL_SCOPES
    assert principal.user_limits == UserLimits()
    assert not principal.web_search_enabled
    assert not principal.external_providers_enabled


def test_ensure_is_idempotent(account_store: AccountStore) -> None:
    assert account_store.ensure_org("acme") == account_store.ensure_org("acme")
    assert account_store.ensure_user("bob") == account_store.ensure_user("bob")
    assert account_store.ensure_user("bob") != account_store.ensure_user("carol")


def test_raw_key_is_not_stored(account_store: AccountStore, db: Database) -> None:
    raw = account_store.create_key("alice", "acme")
    with db.connect() as conn:
        dumped = repr(conn.exec_driver_sql("SELECT * FROM api_keys").all())
    assert raw not in dumped
    assert raw[4:] not in dumped


def test_new_key_keeps_an_existing_admin_role(account_store: AccountStore) -> None:
    account_store.create_key("alice", "acme", role="admin")
    raw = account_store.create_key("alice", "acme")
    assert principal_of(account_store, raw).role == "admin"
    demoted = account_store.create_key("alice", "acme", role="member")
    assert principal_of(account_store, demoted).role == "member"


def test_scopes_and_per_key_limits_are_stored(account_store: AccountStore) -> None:
    raw = account_store.create_key("alice", "acme", scopes="dedicated", rpm=7, tpm=900)
    principal = principal_of(account_store, raw)
    assert principal.scopes == frozenset({"dedicated"})
    assert (principal.key_rpm, principal.key_tpm) == (7, 900)


@pytest.mark.parametrize("scopes", ["inference,admin", ["bogus"], "", []])
def test_unknown_or_empty_scopes_are_invalid(account_store: AccountStore, scopes: object) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        account_store.create_key("alice", "acme", scopes=scopes)  # type: ignore[arg-type]
    assert caught.value.status_code == 400
    assert caught.value.code == "invalid_scopes"
    assert caught.value.param == "scopes"
    assert account_store.get_user("alice") is None  # nothing was written


@pytest.mark.parametrize("bad", ["", " alice", "al ice", "-x", "a" * 200])
def test_invalid_names_are_refused(account_store: AccountStore, bad: str) -> None:
    with pytest.raises(InvalidRequestError):
        account_store.create_key(bad, "acme")


def test_revoke_by_raw_key(account_store: AccountStore) -> None:
    raw = account_store.create_key("alice", "acme")
    other = account_store.create_key("alice", "acme")
    assert account_store.revoke_key(raw) is True
    assert account_store.principal_for_hash(account_store.hash(raw)) is None
    assert account_store.principal_for_hash(account_store.hash(other)) is not None
    assert account_store.revoke_key(raw) is False  # already revoked


def test_revoke_by_id_and_unknown(account_store: AccountStore) -> None:
    raw = account_store.create_key("alice", "acme")
    (info,) = account_store.list_keys("alice")
    assert account_store.revoke_key(info.key_id) is True
    assert account_store.principal_for_hash(account_store.hash(raw)) is None
    assert account_store.revoke_key("key_doesnotexist") is False


def test_list_keys_shows_prefix_and_revocation(account_store: AccountStore) -> None:
    first = account_store.create_key("alice", "acme")
    second = account_store.create_key("alice", "beta", scopes=["inference"])
    account_store.create_key("bob", "acme")
    account_store.revoke_key(first)
    listed = account_store.list_keys("alice")
    assert [k.display_prefix for k in listed] == [first[4:12], second[4:12]]
    assert [k.org for k in listed] == ["acme", "beta"]
    assert listed[0].revoked_at is not None and listed[1].revoked_at is None
    assert listed[1].scopes == frozenset({"inference"})
    with pytest.raises(NotFoundError):
        account_store.list_keys("nobody")


def test_user_updates_change_only_given_fields_and_persist(
    account_store: AccountStore, database_url: str
) -> None:
    raw = account_store.create_key("alice", "acme")
    account_store.update_user("alice", rpm=60, tpm=1000, daily_tokens=50_000, web_search=True)
    account_store.update_user("alice", tpm=0, code_interpreter=True)

    fresh_db = Database(database_url)  # a new engine sees what was committed
    try:
        principal = principal_of(AccountStore(fresh_db, pepper=TEST_PEPPER), raw)
    finally:
        fresh_db.dispose()
    assert principal.user_limits == UserLimits(rpm=60, tpm=None, daily_tokens=50_000)
    assert principal.web_search_enabled
    assert principal.code_interpreter_enabled
    assert not principal.web_fetch_enabled


def test_user_update_errors(account_store: AccountStore) -> None:
    account_store.ensure_user("alice")
    with pytest.raises(NotFoundError) as missing:
        account_store.update_user("nobody", rpm=5)
    assert missing.value.code == "user_not_found"
    with pytest.raises(InvalidRequestError) as negative:
        account_store.update_user("alice", rpm=-1)
    assert negative.value.param == "rpm"


def test_org_flags_persist(account_store: AccountStore) -> None:
    raw = account_store.create_key("alice", "acme")
    record = account_store.update_org("acme", external_providers=True)
    assert record.external_providers_enabled and not record.internal
    account_store.update_org("acme", internal=True)
    principal = principal_of(account_store, raw)
    assert principal.external_providers_enabled
    assert principal.org_internal
    with pytest.raises(NotFoundError):
        account_store.update_org("nowhere", internal=True)


def test_key_of_a_removed_member_does_not_resolve(
    account_store: AccountStore, db: Database
) -> None:
    raw = account_store.create_key("alice", "acme")
    with db.begin() as conn:
        conn.exec_driver_sql("DELETE FROM memberships")
    assert account_store.principal_for_hash(account_store.hash(raw)) is None
