"""API keys as the dashboard manages them (docs/reference/dashboard.md#keys).

A member sees and revokes only their own keys in the session's organization, an admin
every key of it; anything else is a 404, as if the key did not exist (another
organization's key ids are not confirmed). Keys are made and revoked through
``AccountStore``, whose writes bump the accounts generation: a revoked key is refused
at once on every replica (``serve_app.auth.epoch``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from serve_app.auth.accounts import AccountStore, as_utc
from serve_app.auth.principal import ROLE_ADMIN
from serve_app.auth.sessions import Session
from serve_app.protocol.errors import InvalidRequestError, NotFoundError
from serve_app.storage.schema import api_keys, users


def unix(moment: datetime | None) -> int | None:
    return None if moment is None else int(as_utc(moment).timestamp())


@dataclass(frozen=True)
class KeyRecord:
    """A key as a listing shows it: never the key itself."""

    id: str
    name: str | None
    prefix: str
    scopes: list[str]
    user_id: str
    user_name: str
    created_at: int
    expires_at: int | None
    last_used_at: int | None
    revoked_at: int | None


def _record(row: Any) -> KeyRecord:
    return KeyRecord(
        id=row.id,
        name=row.name,
        prefix=row.display_prefix,
        scopes=sorted(row.scopes.split()),
        user_id=row.user_id,
        user_name=row.user_name,
        created_at=int(as_utc(row.created_at).timestamp()),
        expires_at=unix(row.expires_at),
        last_used_at=unix(row.last_used_at),
        revoked_at=unix(row.revoked_at),
    )


class KeyAdmin:
    """List, create and revoke keys for a dashboard session (database work in a thread)."""

    def __init__(self, accounts: AccountStore) -> None:
        self._accounts = accounts

    def _visible(self, session: Session) -> Any:
        """The keys this session may see: its org's, and only its own for a member."""
        where = api_keys.c.org_id == session.org.id
        if session.org.role != ROLE_ADMIN:
            where = sa.and_(where, api_keys.c.user_id == session.user_id)
        return where

    def _select(self, where: Any) -> list[KeyRecord]:
        query = (
            sa.select(api_keys, users.c.name.label("user_name"))
            .join(users, users.c.id == api_keys.c.user_id)
            .where(where)
            .order_by(api_keys.c.created_at.desc(), api_keys.c.id)
        )
        with self._accounts.database.connect() as conn:
            return [_record(row) for row in conn.execute(query)]

    async def list(self, session: Session) -> list[KeyRecord]:
        return await asyncio.to_thread(self._select, self._visible(session))

    async def create(
        self,
        session: Session,
        name: str,
        scopes: Sequence[str] | None,
        expires_at: int | None,
    ) -> tuple[str, KeyRecord]:
        """A new key of the session's user in its organization: (raw key, record)."""
        expiry = None
        if expires_at is not None:
            expiry = datetime.fromtimestamp(expires_at, UTC)
            if expiry <= datetime.now(UTC):
                raise InvalidRequestError(
                    "expires_at must be in the future (Unix seconds).",
                    code="invalid_value",
                    param="expires_at",
                )

        def create() -> tuple[str, KeyRecord]:
            raw = self._accounts.create_key(
                session.user_name,
                session.org.name,
                scopes=scopes,
                name=name,
                expires_at=expiry,
            )
            stored = self._accounts.find_key(self._accounts.hash(raw))
            assert stored is not None  # just written
            return raw, self._select(api_keys.c.id == stored.key_id)[0]

        return await asyncio.to_thread(create)

    async def revoke(self, session: Session, key_id: str) -> KeyRecord:
        """Revoke a visible key (again: a no-op) and answer it as now stored."""

        def revoke() -> KeyRecord:
            where = sa.and_(self._visible(session), api_keys.c.id == key_id)
            found = self._select(where)
            if not found:
                raise NotFoundError(f"No key {key_id!r}.", code="key_not_found", param="id")
            if found[0].revoked_at is None:
                self._accounts.revoke_key(key_id)
            return self._select(where)[0]

        return await asyncio.to_thread(revoke)
