"""AuthService: the 401/403 behaviour of docs/reference/common.md#authentication and the
verified-key cache."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from serve_app.auth.accounts import AccountStore, StoredKey
from serve_app.auth.keys import generate_key
from serve_app.auth.service import AuthService
from serve_app.protocol.errors import AuthenticationError, PermissionDeniedError
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database
from serve_app.storage.schema import api_keys


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingStore:
    """Delegates to a real store and counts database lookups."""

    def __init__(self, store: AccountStore) -> None:
        self._store = store
        self.lookups = 0

    def hash(self, raw_key: str) -> str:
        return self._store.hash(raw_key)

    def find_key(self, key_hash: str) -> StoredKey | None:
        self.lookups += 1
        return self._store.find_key(key_hash)

    def touch_key(self, key_id: str) -> None:
        self._store.touch_key(key_id)


def make_auth(
    store: AccountStore | CountingStore, ttl: float, clock: FakeClock, entries: int = 100
) -> AuthService:
    settings = GatewaySettings(auth_cache_seconds=ttl)
    return AuthService(store, settings, clock=clock, max_cache_entries=entries)


def refused(auth: AuthService, header: str | None) -> AuthenticationError:
    with pytest.raises(AuthenticationError) as caught:
        auth.authenticate(header)
    error = caught.value
    assert error.status_code == 401
    assert error.code == "invalid_api_key"
    assert error.body().type == "authentication_error"
    return error


def test_valid_bearer_key_authenticates(account_store: AccountStore) -> None:
    raw = account_store.create_key("alice", "acme", role="admin")
    auth = make_auth(account_store, 1.0, FakeClock())
    principal = auth.authenticate(f"Bearer {raw}")
    assert principal.user_id == account_store.ensure_user("alice")
    assert principal.role == "admin"
    assert auth.authenticate(f"bearer   {raw}  ") == principal


def test_every_401_case_has_the_same_code_and_its_own_message(
    account_store: AccountStore,
) -> None:
    raw = account_store.create_key("alice", "acme")
    account_store.revoke_key(raw)
    auth = make_auth(account_store, 1.0, FakeClock())
    cases: dict[str, list[str | None]] = {
        "missing": [None, "", "   "],
        "malformed header": ["Basic abc", "Bearer", f"Bearer {raw} extra", f"Token {raw}"],
        "malformed key": ["Bearer sk-abc", "Bearer gwk_short", f"Bearer {raw}x"],
        "unknown": [f"Bearer {generate_key()}"],
        "revoked": [f"Bearer {raw}"],
    }
    messages = {
        case: {refused(auth, header).message for header in headers}
        for case, headers in cases.items()
    }
    assert all(len(found) == 1 for found in messages.values()), messages
    assert len({found.pop() for found in messages.values()}) == len(cases)


def test_key_hashed_with_another_pepper_is_unknown(db: Database) -> None:
    raw = AccountStore(db, pepper="old").create_key("alice", "acme")
    auth = make_auth(AccountStore(db, pepper="new"), 1.0, FakeClock())
    assert "Incorrect" in refused(auth, f"Bearer {raw}").message


def test_revocation_takes_effect_after_the_cache_ttl(account_store: AccountStore) -> None:
    raw = account_store.create_key("alice", "acme")
    clock = FakeClock()
    auth = make_auth(account_store, 5.0, clock)
    auth.authenticate(f"Bearer {raw}")
    account_store.revoke_key(raw)
    clock.now += 4.9
    auth.authenticate(f"Bearer {raw}")  # still trusted from the cache
    clock.now += 0.2
    assert "revoked" in refused(auth, f"Bearer {raw}").message


def test_zero_ttl_sees_revocation_at_once(account_store: AccountStore) -> None:
    raw = account_store.create_key("alice", "acme")
    auth = make_auth(account_store, 0.0, FakeClock())
    auth.authenticate(f"Bearer {raw}")
    account_store.revoke_key(raw)
    refused(auth, f"Bearer {raw}")


def test_cache_spares_the_database_and_is_bounded(account_store: AccountStore) -> None:
    first = account_store.create_key("alice", "acme")
    second = account_store.create_key("bob", "acme")
    counting = CountingStore(account_store)
    auth = make_auth(counting, 60.0, FakeClock(), entries=1)
    for _ in range(50):
        auth.authenticate(f"Bearer {first}")
    assert counting.lookups == 1
    auth.authenticate(f"Bearer {second}")  # evicts the first key
    auth.authenticate(f"Bearer {first}")
    assert counting.lookups == 3


def test_concurrent_authentication(account_store: AccountStore) -> None:
    keys = [account_store.create_key(f"user{i}", "acme") for i in range(4)]
    auth = make_auth(account_store, 60.0, FakeClock(), entries=2)
    failures: list[BaseException] = []

    def hammer(raw: str) -> None:
        try:
            for _ in range(25):
                assert auth.authenticate(f"Bearer {raw}").scopes
        except BaseException as exc:  # collected and re-raised in the test thread
            failures.append(exc)

    threads = [threading.Thread(target=hammer, args=(k,)) for k in keys * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_scope_outside_the_grant_is_403(account_store: AccountStore) -> None:
    raw = account_store.create_key("alice", "acme", scopes="inference")
    principal = make_auth(account_store, 1.0, FakeClock()).authenticate(f"Bearer {raw}")
    AuthService.require_scope(principal, "inference")
    with pytest.raises(PermissionDeniedError) as caught:
        AuthService.require_scope(principal, "dedicated")
    assert caught.value.status_code == 403
    assert caught.value.code == "insufficient_scope"
    assert "dedicated" not in caught.value.message and "inference" not in caught.value.message


def test_an_expired_key_is_refused_even_when_cached(account_store: AccountStore) -> None:
    expires = datetime.now(UTC) + timedelta(seconds=100)
    raw = account_store.create_key("alice", "acme", expires_at=expires)
    wall = [expires.timestamp() - 10]
    settings = GatewaySettings(auth_cache_seconds=60)
    auth = AuthService(account_store, settings, clock=FakeClock(), wall_clock=lambda: wall[0])
    header = f"Bearer {raw}"
    assert auth.authenticate(header).key_expires_at == pytest.approx(expires.timestamp())
    assert auth.cached(header) is not None
    wall[0] = expires.timestamp()
    assert auth.cached(header) is None
    assert "expired" in refused(auth, header).message
    assert account_store.principal_for_key_id(auth_key_id(account_store, raw)) is not None
    past = account_store.create_key("alice", "acme", expires_at=datetime.now(UTC))
    assert account_store.principal_for_key_id(auth_key_id(account_store, past)) is None


def auth_key_id(store: AccountStore, raw: str) -> str:
    stored = store.find_key(store.hash(raw))
    assert stored is not None
    return stored.key_id


def test_authentication_records_the_last_use(account_store: AccountStore) -> None:
    raw = account_store.create_key("alice", "acme")
    auth = make_auth(account_store, 0, FakeClock())
    with account_store.database.connect() as conn:
        before = conn.execute(sa.select(api_keys.c.last_used_at)).scalar()
    auth.authenticate(f"Bearer {raw}")
    with account_store.database.connect() as conn:
        after = conn.execute(sa.select(api_keys.c.last_used_at)).scalar()
    assert before is None and after is not None


def test_cached_fast_path_never_touches_the_database(account_store: AccountStore) -> None:
    raw = account_store.create_key("alice", "acme")
    counting = CountingStore(account_store)
    clock = FakeClock()
    auth = make_auth(counting, 5.0, clock)
    header = f"Bearer {raw}"
    assert auth.cached(header) is None  # not verified yet: the caller must authenticate
    principal = auth.authenticate(header)
    assert counting.lookups == 1
    assert auth.cached(header) == principal
    assert auth.cached("Bearer gwk_" + "A" * 40) is None
    assert auth.cached("Basic nope") is None and auth.cached(None) is None
    clock.now += 5.1
    assert auth.cached(header) is None  # expired: back to the database
    assert counting.lookups == 1
