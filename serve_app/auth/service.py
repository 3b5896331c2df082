"""Turn an ``Authorization`` header into a ``Principal`` (docs/reference/common.md#authentication).

Every inference request passes through ``authenticate``, so verified keys are
cached by hash for ``auth_cache_seconds`` (60 s): the database sees one lookup
per key per interval and replica, not one per request. (At 1 s, a caller
pausing longer than a second between calls paid a database lookup in a thread,
~2.3 ms of time to first token, on every call: issue 14.) A revocation, a flag or limit
change must still take effect at once on every replica: the cache is dropped
whenever the accounts generation moves (``serve_app.auth.epoch``: in-process at
once, through Redis on the next request, through the database within 50 ms).
Failures are never cached, so a key works the moment it is created.

All four 401 cases share the code ``invalid_api_key``
(docs/reference/common.md#keys);
only the message differs, to tell a client what to fix.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from serve_app.auth.accounts import StoredKey
from serve_app.auth.epoch import EpochWatch, Seen
from serve_app.auth.keys import KEY_BODY_LENGTH, KEY_PREFIX, looks_like_key
from serve_app.auth.principal import Principal
from serve_app.protocol.errors import AuthenticationError, PermissionDeniedError
from serve_app.settings import GatewaySettings

DEFAULT_CACHE_ENTRIES = 10_000


class KeyLookup(Protocol):
    """The part of ``AccountStore`` authentication needs."""

    def hash(self, raw_key: str) -> str: ...

    def find_key(self, key_hash: str) -> StoredKey | None: ...

    def touch_key(self, key_id: str) -> None:
        """Record that the key was just used (its listing's ``last_used_at``)."""
        ...


class _TTLCache:
    """A thread-safe, size-bounded map whose entries expire ``ttl`` seconds after insertion."""

    def __init__(self, ttl: float, max_entries: int, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, Principal]] = OrderedDict()
        self.generation = 0

    def get(self, key: str) -> Principal | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            expires_at, principal = entry
            if self._clock() >= expires_at:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return principal

    def put(self, key: str, principal: Principal, generation: int) -> None:
        """Cache unless the cache was cleared since ``generation`` was read: a lookup
        that raced a revocation must not put the stale answer back."""
        if self._ttl <= 0 or self._max_entries <= 0:
            return
        with self._lock:
            if generation != self.generation:
                return
            self._entries[key] = (self._clock() + self._ttl, principal)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.generation += 1


def _invalid(message: str) -> AuthenticationError:
    return AuthenticationError(message, code="invalid_api_key")


class AuthService:
    """Authenticates API keys and checks what an authenticated key may do.

    ``clock`` is injectable so tests can move time past the cache TTL;
    ``epochs`` tells the cache when accounts changed (None: only the TTL does).
    """

    def __init__(
        self,
        store: KeyLookup,
        settings: GatewaySettings,
        *,
        max_cache_entries: int = DEFAULT_CACHE_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
        epochs: EpochWatch | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._wall_clock = wall_clock
        self._cache = _TTLCache(settings.auth_cache_seconds, max_cache_entries, clock)
        self._epochs = epochs
        self._seen: Seen | None = None
        self._seen_lock = threading.Lock()

    def _observe(self, seen: Seen) -> None:
        with self._seen_lock:
            if seen != self._seen:
                self._seen = seen
                self._cache.clear()

    async def refresh(self) -> None:
        """Drop the cache if accounts changed anywhere; call before ``cached`` per request."""
        if self._epochs is not None:
            self._observe(await self._epochs.current())

    async def aclose(self) -> None:
        if self._epochs is not None:
            await self._epochs.aclose()

    def cached(self, authorization_header: str | None) -> Principal | None:
        """The caller if its key was verified within the TTL, without touching the database.

        Cheap enough for the event loop (a hash and a dict lookup), so the hot
        path skips the thread hop that a database lookup needs. ``None`` means
        "ask ``authenticate``", including for every malformed header.
        """
        try:
            raw_key = _bearer_token(authorization_header)
        except AuthenticationError:
            return None
        principal = self._cache.get(self._store.hash(raw_key))
        if principal is None or self._expired(principal):
            return None  # ``authenticate`` answers the 401 of an expired key
        return principal

    def _expired(self, principal: Principal) -> bool:
        expires = principal.key_expires_at
        return expires is not None and self._wall_clock() >= expires

    def authenticate(self, authorization_header: str | None) -> Principal:
        """The caller behind ``Authorization: Bearer <key>``, or ``AuthenticationError`` (401)."""
        raw_key = _bearer_token(authorization_header)
        key_hash = self._store.hash(raw_key)
        if self._epochs is not None:
            self._observe(self._epochs.current_sync())
        generation = self._cache.generation
        cached = self._cache.get(key_hash)
        if cached is not None and not self._expired(cached):
            return cached
        stored = self._store.find_key(key_hash)
        if stored is None or not hmac.compare_digest(stored.key_hash, key_hash):
            raise _invalid("Incorrect API key provided.")
        if stored.revoked_at is not None:
            raise _invalid("This API key has been revoked.")
        if stored.principal is None:
            raise _invalid("This API key's user is no longer a member of its organization.")
        if self._expired(stored.principal):
            raise _invalid("This API key has expired.")
        # Once per cache miss (at most once per auth_cache_seconds per key and replica).
        self._store.touch_key(stored.key_id)
        self._cache.put(key_hash, stored.principal, generation)
        return stored.principal

    def forget_cached(self) -> None:
        """Drop every cached key, e.g. right after an operator revokes keys in-process."""
        self._cache.clear()

    @staticmethod
    def require_scope(principal: Principal, scope: str) -> None:
        """403 ``insufficient_scope`` unless the key was granted ``scope``.

        The message names no scope (docs/reference/common.md#scopes-and-session-only-routes).
        """
        if scope not in principal.scopes:
            raise PermissionDeniedError(
                "This API key is not allowed to use this route.", code="insufficient_scope"
            )


def _bearer_token(header: str | None) -> str:
    """The key part of a Bearer header, refusing anything not shaped like a key."""
    if header is None or not header.strip():
        raise _invalid(
            "Missing API key: send it as 'Authorization: Bearer <API key>'.",
        )
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        raise _invalid(
            "Malformed Authorization header: expected 'Bearer <API key>'.",
        )
    token = parts[1]
    if not looks_like_key(token):
        raise _invalid(
            f"Malformed API key: keys start with '{KEY_PREFIX}' followed by "
            f"{KEY_BODY_LENGTH} letters and digits.",
        )
    return token
