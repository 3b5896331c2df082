"""Orgs, users, memberships and API keys in the database.

The store is the only code that writes these tables. It hands out plain
dataclasses (``Principal``, ``KeyInfo``...) so auth, limits and billing never
see SQLAlchemy rows. Names are the operator-facing handles (the CLI takes
``--user alice --org acme``); ids are what other tables reference.

Limits follow one rule everywhere: ``None`` leaves a value unchanged, ``0``
clears it (back to NULL, meaning the platform default governs), a positive
integer sets it. A limit of "zero requests" is not expressible on purpose:
revoke the key instead.
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from serve_app.auth.epoch import bump_in_transaction, bump_local
from serve_app.auth.keys import display_prefix, generate_key, hash_key, looks_like_key
from serve_app.auth.principal import ALL_SCOPES, ROLE_MEMBER, ROLES, Principal, UserLimits
from serve_app.protocol.errors import InvalidRequestError, NotFoundError
from serve_app.storage.db import Database
from serve_app.storage.schema import api_keys, memberships, orgs, users, utcnow

logger = logging.getLogger(__name__)

LAST_USED_RESOLUTION_S = 60
"""A key's ``last_used_at`` is written at most this often (it is a listing's hint)."""

_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")


TOOL_FLAGS = ("web_search_enabled", "web_fetch_enabled", "code_interpreter_enabled")
"""A member has a tool when their user's flag or their org's flag is on."""

# What a principal needs about its user, org and membership (joined by every lookup).
MEMBER_COLUMNS = (
    *(users.c[c] for c in ("rpm", "tpm", "daily_tokens", *TOOL_FLAGS)),
    *(orgs.c[c].label(f"org_{c}") for c in TOOL_FLAGS),
    orgs.c.external_providers_enabled,
    orgs.c.internal,
    memberships.c.role,
)

# Everything authentication needs about a key, fetched in one joined query.
_KEY_LOOKUP_COLUMNS = (
    *(api_keys.c[c] for c in ("id", "key_hash", "user_id", "org_id", "scopes", "revoked_at")),
    api_keys.c.rpm.label("key_rpm"),
    api_keys.c.tpm.label("key_tpm"),
    api_keys.c.expires_at.label("key_expires_at"),
    *MEMBER_COLUMNS,
)


@dataclass(frozen=True)
class StoredKey:
    """A key row as authentication needs it; ``principal`` is None once membership ends."""

    key_id: str
    key_hash: str
    revoked_at: datetime | None
    principal: Principal | None


@dataclass(frozen=True)
class KeyInfo:
    """What a key listing may show: never the key itself."""

    key_id: str
    display_prefix: str
    org: str
    scopes: frozenset[str]
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True)
class UserRecord:
    id: str
    name: str
    limits: UserLimits
    web_search_enabled: bool
    web_fetch_enabled: bool
    code_interpreter_enabled: bool


@dataclass(frozen=True)
class OrgRecord:
    id: str
    name: str
    external_providers_enabled: bool
    internal: bool


def _new_id(kind: str) -> str:
    return f"{kind}_{secrets.token_hex(12)}"


def _check_name(kind: str, name: str) -> None:
    if not _NAME_PATTERN.fullmatch(name):
        raise InvalidRequestError(
            f"Invalid {kind} name {name!r}: use 1-128 letters, digits or . _ @ + -, "
            "starting with a letter or digit.",
            code="invalid_name",
            param=kind,
        )


def parse_scopes(scopes: str | Iterable[str] | None) -> frozenset[str]:
    """Scope names from a list or a comma/space separated string; ``None`` grants all.

    Every key gets every scope unless narrowed, because one key
    serves both the ``/v1`` API and the ``/api`` routes.
    """
    if scopes is None:
        return ALL_SCOPES
    items = re.split(r"[,\s]+", scopes) if isinstance(scopes, str) else list(scopes)
    wanted = frozenset(s.strip() for s in items if s.strip())
    unknown = sorted(wanted - ALL_SCOPES)
    if unknown or not wanted:
        raise InvalidRequestError(
            f"Invalid scopes {unknown or '(none)'}; choose one or more of "
            f"{', '.join(sorted(ALL_SCOPES))}.",
            code="invalid_scopes",
            param="scopes",
        )
    return wanted


def _limit_value(field: str, value: int | None) -> dict[str, int | None]:
    """The column update for one limit argument (see the module docstring)."""
    if value is None:
        return {}
    if value < 0:
        raise InvalidRequestError(
            f"{field} must be a positive integer, or 0 to clear it.",
            code="invalid_limit",
            param=field,
        )
    return {field: value or None}


class AccountStore:
    """Reads and writes accounts; ``pepper`` must match the one used to authenticate.

    Every write that can change what a key may do (revocation, limits, tool
    flags, roles, an org's switches) announces itself so replicas drop their
    auth caches (``serve_app.auth.epoch``): in its transaction, in this process,
    and through ``publish`` (Redis, when configured) once committed.
    """

    def __init__(
        self, db: Database, *, pepper: str = "", publish: Callable[[], None] | None = None
    ) -> None:
        self._db = db
        self._pepper = pepper
        self._publish = publish

    @contextmanager
    def _account_write(self) -> Iterator[Connection]:
        """A write transaction that bumps the accounts generation when it commits."""
        with self._db.begin() as conn:
            yield conn
            bump_in_transaction(conn)
        bump_local(self._db)
        if self._publish is not None:
            self._publish()

    @property
    def database(self) -> Database:
        return self._db

    def write(self) -> AbstractContextManager[Connection]:
        """A transaction for account writes made elsewhere (``serve_app.auth.members``):
        it bumps the accounts generation, so every replica drops its auth cache."""
        return self._account_write()

    def hash(self, raw_key: str) -> str:
        """The stored form of a raw key under this store's pepper."""
        return hash_key(raw_key, self._pepper)

    # ---- dialect helpers -------------------------------------------------
    def _insert(self, table: sa.Table) -> Any:
        """An INSERT that supports ``ON CONFLICT`` on both supported databases."""
        if self._db.dialect == "postgresql":
            return postgresql.insert(table)
        if self._db.dialect == "sqlite":
            return sqlite.insert(table)
        raise RuntimeError(f"unsupported database dialect {self._db.dialect!r}")

    def _ensure_named(self, conn: Connection, table: sa.Table, kind: str, name: str) -> str:
        """Id of the row called ``name``, inserting it first; safe under concurrent calls."""
        _check_name(kind, name)
        stmt = self._insert(table).values(id=_new_id(kind), name=name, created_at=utcnow())
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
        found = conn.execute(sa.select(table.c.id).where(table.c.name == name)).scalar_one()
        return str(found)

    def _require_id(self, conn: Connection, table: sa.Table, kind: str, name: str) -> str:
        found = conn.execute(sa.select(table.c.id).where(table.c.name == name)).scalar()
        if found is None:
            raise NotFoundError(f"No {kind} named {name!r}.", code=f"{kind}_not_found", param=kind)
        return str(found)

    def _set_membership(self, conn: Connection, user_id: str, org_id: str, role: str) -> None:
        if role not in ROLES:
            raise InvalidRequestError(
                f"Invalid role {role!r}; choose one of {', '.join(sorted(ROLES))}.",
                code="invalid_role",
                param="role",
            )
        stmt = self._insert(memberships).values(user_id=user_id, org_id=org_id, role=role)
        conn.execute(
            stmt.on_conflict_do_update(index_elements=["user_id", "org_id"], set_={"role": role})
        )

    # ---- orgs, users, memberships ---------------------------------------
    def ensure_org(self, name: str) -> str:
        """Id of the org, created when missing."""
        with self._db.begin() as conn:
            return self._ensure_named(conn, orgs, "org", name)

    def ensure_user(self, name: str) -> str:
        """Id of the user, created when missing."""
        with self._db.begin() as conn:
            return self._ensure_named(conn, users, "user", name)

    def set_membership(self, user: str, org: str, role: str) -> None:
        """Make ``user`` a member of ``org`` with ``role``, creating either when missing."""
        with self._account_write() as conn:
            user_id = self._ensure_named(conn, users, "user", user)
            org_id = self._ensure_named(conn, orgs, "org", org)
            self._set_membership(conn, user_id, org_id, role)

    def _find_named(self, table: sa.Table, name: str) -> sa.RowMapping | None:
        with self._db.connect() as conn:
            return conn.execute(sa.select(table).where(table.c.name == name)).mappings().first()

    def get_user(self, name: str) -> UserRecord | None:
        row = self._find_named(users, name)
        return None if row is None else _user_record(row)

    def get_org(self, name: str) -> OrgRecord | None:
        row = self._find_named(orgs, name)
        return None if row is None else _org_record(row)

    def _update_named(
        self, table: sa.Table, kind: str, name: str, values: Mapping[str, Any]
    ) -> sa.RowMapping:
        """Apply ``values`` to the named row and return it as now stored."""
        with self._account_write() as conn:
            if values:
                conn.execute(sa.update(table).where(table.c.name == name).values(**values))
            row = conn.execute(sa.select(table).where(table.c.name == name)).mappings().first()
        if row is None:
            raise NotFoundError(f"No {kind} named {name!r}.", code=f"{kind}_not_found", param=kind)
        return row

    def update_user(
        self,
        name: str,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        daily_tokens: int | None = None,
        web_search: bool | None = None,
        web_fetch: bool | None = None,
        code_interpreter: bool | None = None,
    ) -> UserRecord:
        """Change only the given fields; a limit of 0 clears it (platform default)."""
        values: dict[str, Any] = {
            **_limit_value("rpm", rpm),
            **_limit_value("tpm", tpm),
            **_limit_value("daily_tokens", daily_tokens),
        }
        flags = {
            "web_search_enabled": web_search,
            "web_fetch_enabled": web_fetch,
            "code_interpreter_enabled": code_interpreter,
        }
        values.update({column: flag for column, flag in flags.items() if flag is not None})
        return _user_record(self._update_named(users, "user", name, values))

    def update_org(
        self, name: str, *, external_providers: bool | None = None, internal: bool | None = None
    ) -> OrgRecord:
        """Change only the given flags of an existing org."""
        flags = {"external_providers_enabled": external_providers, "internal": internal}
        values = {column: flag for column, flag in flags.items() if flag is not None}
        return _org_record(self._update_named(orgs, "org", name, values))

    # ---- keys -------------------------------------------------------------
    def create_key(
        self,
        user: str,
        org: str,
        role: str | None = None,
        scopes: str | Iterable[str] | None = None,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        name: str | None = None,
        expires_at: datetime | None = None,
    ) -> str:
        """Create a key and return it raw; the only time the raw key exists.

        Missing users and orgs are created. ``role=None`` keeps an existing
        membership's role (new members get ``member``), so issuing a key never
        silently demotes an admin. ``name`` labels it in listings; after
        ``expires_at`` it is refused like a revoked key.
        """
        granted = parse_scopes(scopes)
        limits = {**_limit_value("rpm", rpm), **_limit_value("tpm", tpm)}
        raw = generate_key()
        key_id = _new_id("key")
        with self._account_write() as conn:  # may change an existing membership's role
            user_id = self._ensure_named(conn, users, "user", user)
            org_id = self._ensure_named(conn, orgs, "org", org)
            current = conn.execute(
                sa.select(memberships.c.role).where(
                    memberships.c.user_id == user_id, memberships.c.org_id == org_id
                )
            ).scalar()
            self._set_membership(conn, user_id, org_id, role or current or ROLE_MEMBER)
            conn.execute(
                sa.insert(api_keys).values(
                    id=key_id,
                    key_hash=self.hash(raw),
                    display_prefix=display_prefix(raw),
                    user_id=user_id,
                    org_id=org_id,
                    scopes=" ".join(sorted(granted)),
                    created_at=utcnow(),
                    name=name,
                    expires_at=expires_at,
                    **limits,
                )
            )
        logger.info("created key %s for user %s in org %s", key_id, user, org)
        return raw

    def revoke_key(self, raw_or_id: str) -> bool:
        """Revoke by raw key or key id; False when no such unrevoked key exists."""
        if looks_like_key(raw_or_id):
            match = api_keys.c.key_hash == self.hash(raw_or_id)
        else:
            match = api_keys.c.id == raw_or_id
        revoke = (
            sa.update(api_keys)
            .where(match, api_keys.c.revoked_at.is_(None))
            .values(revoked_at=utcnow())
            .returning(api_keys.c.id)
        )
        with self._account_write() as conn:
            revoked_ids = list(conn.execute(revoke).scalars())
        for key_id in revoked_ids:
            logger.info("revoked key %s", key_id)
        return bool(revoked_ids)

    def list_keys(self, user: str) -> list[KeyInfo]:
        """The user's keys, oldest first, revoked ones included."""
        query = (
            sa.select(api_keys, orgs.c.name.label("org_name"))
            .join(orgs, orgs.c.id == api_keys.c.org_id)
            .join(users, users.c.id == api_keys.c.user_id)
            .where(users.c.name == user)
            .order_by(api_keys.c.created_at, api_keys.c.id)
        )
        with self._db.connect() as conn:
            self._require_id(conn, users, "user", user)
            rows = conn.execute(query).mappings().all()
        return [
            KeyInfo(
                key_id=row["id"],
                display_prefix=row["display_prefix"],
                org=row["org_name"],
                scopes=frozenset(row["scopes"].split()),
                created_at=row["created_at"],
                revoked_at=row["revoked_at"],
            )
            for row in rows
        ]

    def find_key(self, key_hash: str) -> StoredKey | None:
        """The key with its user, org and membership, in one joined query."""
        return self._stored_key(api_keys.c.key_hash == key_hash)

    def touch_key(self, key_id: str) -> None:
        """Set ``last_used_at``, at most once a minute per key (a no-op write otherwise)."""
        now = utcnow()
        stale = sa.or_(
            api_keys.c.last_used_at.is_(None),
            api_keys.c.last_used_at < now - timedelta(seconds=LAST_USED_RESOLUTION_S),
        )
        with self._db.begin() as conn:
            conn.execute(
                sa.update(api_keys).where(api_keys.c.id == key_id, stale).values(last_used_at=now)
            )

    def principal_for_key_id(self, key_id: str) -> Principal | None:
        """The caller behind a key id, as now (a batch runs under its creator's key, or
        None when missing, revoked, expired or no longer a member. Batches made in a
        dashboard session ask ``SessionStore.principal_for_key_id`` instead."""
        stored = self._stored_key(api_keys.c.id == key_id)
        if stored is None or stored.revoked_at is not None or stored.principal is None:
            return None
        expires = stored.principal.key_expires_at
        if expires is not None and expires <= utcnow().timestamp():
            return None
        return stored.principal

    def _stored_key(self, where: Any) -> StoredKey | None:
        query = (
            sa.select(*_KEY_LOOKUP_COLUMNS)
            .join(users, users.c.id == api_keys.c.user_id)
            .join(orgs, orgs.c.id == api_keys.c.org_id)
            .outerjoin(
                memberships,
                sa.and_(
                    memberships.c.user_id == api_keys.c.user_id,
                    memberships.c.org_id == api_keys.c.org_id,
                ),
            )
            .where(where)
        )
        with self._db.connect() as conn:
            row = conn.execute(query).mappings().first()
        if row is None:
            return None
        return StoredKey(
            key_id=row["id"],
            key_hash=row["key_hash"],
            revoked_at=row["revoked_at"],
            principal=None if row["role"] is None else _principal(row),
        )

    def principal_for_hash(self, key_hash: str) -> Principal | None:
        """The caller behind a key hash; None when missing, revoked or no longer a member."""
        stored = self.find_key(key_hash)
        if stored is None or stored.revoked_at is not None:
            return None
        if not hmac.compare_digest(stored.key_hash, key_hash):
            return None
        return stored.principal


def _principal(row: sa.RowMapping) -> Principal:
    expires = row["key_expires_at"]
    return member_principal(
        row,
        key_id=row["id"],
        scopes=frozenset(row["scopes"].split()),
        key_rpm=row["key_rpm"],
        key_tpm=row["key_tpm"],
        key_expires_at=None if expires is None else as_utc(expires).timestamp(),
    )


def as_utc(moment: datetime) -> datetime:
    """SQLite hands timestamps back without their zone; they were stored in UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def member_principal(
    row: sa.RowMapping,
    *,
    key_id: str,
    scopes: frozenset[str],
    key_rpm: int | None = None,
    key_tpm: int | None = None,
    key_expires_at: float | None = None,
) -> Principal:
    """The caller from a row holding ``MEMBER_COLUMNS`` and ``user_id``/``org_id``: a key's,
    or a dashboard session's (``serve_app.auth.sessions``)."""
    return Principal(
        key_id=key_id,
        user_id=row["user_id"],
        org_id=row["org_id"],
        role=row["role"],
        scopes=scopes,
        web_search_enabled=row["web_search_enabled"] or row["org_web_search_enabled"],
        web_fetch_enabled=row["web_fetch_enabled"] or row["org_web_fetch_enabled"],
        code_interpreter_enabled=(
            row["code_interpreter_enabled"] or row["org_code_interpreter_enabled"]
        ),
        external_providers_enabled=row["external_providers_enabled"],
        org_internal=row["internal"],
        user_limits=UserLimits(rpm=row["rpm"], tpm=row["tpm"], daily_tokens=row["daily_tokens"]),
        key_rpm=key_rpm,
        key_tpm=key_tpm,
        key_expires_at=key_expires_at,
    )


def _user_record(row: sa.RowMapping) -> UserRecord:
    return UserRecord(
        id=row["id"],
        name=row["name"],
        limits=UserLimits(rpm=row["rpm"], tpm=row["tpm"], daily_tokens=row["daily_tokens"]),
        web_search_enabled=row["web_search_enabled"],
        web_fetch_enabled=row["web_fetch_enabled"],
        code_interpreter_enabled=row["code_interpreter_enabled"],
    )


def _org_record(row: sa.RowMapping) -> OrgRecord:
    return OrgRecord(
        id=row["id"],
        name=row["name"],
        external_providers_enabled=row["external_providers_enabled"],
        internal=row["internal"],
    )
