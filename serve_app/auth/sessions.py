"""Dashboard sessions, passwords and one-time sign-in links, in the database
(docs/reference/dashboard.md).

A session is a row, not a signed cookie: every gateway replica reads it on every
request, so a sign-out, a password change or a member's removal ends it everywhere at
once, with no cache to drop. The cookie carries a random token; only its SHA-256 is
stored (the token has 256 random bits, so a fast hash suffices, as for API keys), and so
is the one-time link's. The row also holds the CSRF token that writes must echo.

A session acts as its user in its current organization with every scope: its
``Principal`` has ``key_id`` ``sess_<id>``, so usage recorded in a session is
attributed to it, and a batch made in a session keeps running under it while its user
stays a member (``principal_for_key_id``), even after the session itself ended.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from serve_app.auth.accounts import MEMBER_COLUMNS, AccountStore, as_utc, member_principal
from serve_app.auth.passwords import check_new_password, hash_password, verify_password
from serve_app.auth.principal import ALL_SCOPES, Principal
from serve_app.protocol.errors import AuthenticationError, NotFoundError, PermissionDeniedError
from serve_app.storage.db import Database
from serve_app.storage.schema import dashboard_sessions, login_tokens, memberships, orgs, users
from serve_app.storage.schema import utcnow as _utcnow

logger = logging.getLogger(__name__)

SESSION_KEY_PREFIX = "sess_"
"""The ``key_id`` of a session's principal: ``sess_`` and the session's id."""

PURGE_AFTER = timedelta(days=30)
"""Ended or expired session rows older than this are deleted at the next sign-in."""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class OrgRole:
    """An organization the user belongs to, with their role in it."""

    id: str
    name: str
    role: str


@dataclass(frozen=True)
class Session:
    """A live session: who, in which organization, until when, and its CSRF token."""

    id: str
    user_id: str
    user_name: str
    org: OrgRole
    orgs: tuple[OrgRole, ...]
    csrf_token: str
    expires_at: datetime
    principal: Principal


def invalid_credentials() -> AuthenticationError:
    return AuthenticationError("Incorrect user name or password.", code="invalid_credentials")


class SessionStore:
    """Reads and writes ``dashboard_sessions`` and ``login_tokens``, and user passwords.

    ``ttl_s``: a session's lifetime from sign-in; ``link_ttl_s``: a sign-in link's.
    ``clock`` is injectable so tests can move past an expiry.
    """

    def __init__(
        self,
        db: Database,
        accounts: AccountStore,
        *,
        ttl_s: int,
        link_ttl_s: int = 900,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._db = db
        self._accounts = accounts
        self._ttl = timedelta(seconds=ttl_s)
        self._link_ttl = timedelta(seconds=link_ttl_s)
        self._clock = clock

    # ---- passwords ---------------------------------------------------------
    def check_password(self, username: str, password: str) -> str | None:
        """The user's id when ``password`` is theirs, else None (same cost either way)."""
        with self._db.connect() as conn:
            row = conn.execute(
                sa.select(users.c.id, users.c.password_hash).where(users.c.name == username)
            ).first()
        stored = None if row is None else row.password_hash
        if not verify_password(stored, password) or row is None:
            return None
        return str(row.id)

    def set_password(self, username: str, password: str) -> str:
        """Set (or replace) a user's password and end all their sessions; the user's id.

        The user must exist (``gateway keys create`` or an org admin made them)."""
        check_new_password(password)
        with self._db.begin() as conn:
            user_id = conn.execute(sa.select(users.c.id).where(users.c.name == username)).scalar()
            if user_id is None:
                raise NotFoundError(
                    f"No user named {username!r}.", code="user_not_found", param="user"
                )
            self._write_password(conn, str(user_id), password)
        return str(user_id)

    def change_password(self, session: Session, current: str, new: str) -> None:
        """A signed-in user's own change: the current password first; their other
        sessions end, this one stays."""
        if self.check_password(session.user_name, current) is None:
            raise PermissionDeniedError(
                "The current password is not correct.",
                code="invalid_credentials",
                param="current_password",
            )
        check_new_password(new, "new_password")
        with self._db.begin() as conn:
            self._write_password(conn, session.user_id, new, keep=session.id)

    def _write_password(
        self, conn: sa.Connection, user_id: str, password: str, keep: str | None = None
    ) -> None:
        conn.execute(
            sa.update(users)
            .where(users.c.id == user_id)
            .values(password_hash=hash_password(password))
        )
        self._end_where(conn, dashboard_sessions.c.user_id == user_id, keep=keep)

    # ---- sessions ----------------------------------------------------------
    def start(self, user_id: str, org_id: str | None = None) -> tuple[str, Session]:
        """A new session for the user (in ``org_id``, else their first organization);
        the raw cookie token and the session. 403 ``no_organization`` for a user who
        belongs to none."""
        now = self._clock()
        orgs_of_user = self._orgs_of(user_id)
        chosen = next((o for o in orgs_of_user if o.id == org_id), None) or next(
            iter(orgs_of_user), None
        )
        if chosen is None:
            raise PermissionDeniedError(
                "This user belongs to no organization yet; an admin must add them first.",
                code="no_organization",
            )
        token = secrets.token_urlsafe(32)
        session_id = f"{SESSION_KEY_PREFIX}{secrets.token_hex(12)}"
        with self._db.begin() as conn:
            conn.execute(
                sa.delete(dashboard_sessions).where(
                    dashboard_sessions.c.expires_at < now - PURGE_AFTER
                )
            )
            conn.execute(
                sa.insert(dashboard_sessions).values(
                    id=session_id,
                    token_hash=_digest(token),
                    user_id=user_id,
                    org_id=chosen.id,
                    csrf_token=secrets.token_urlsafe(32),
                    created_at=now,
                    expires_at=now + self._ttl,
                )
            )
        session = self.lookup(token)
        assert session is not None  # just written
        logger.info("dashboard session started for user %s in org %s", user_id, chosen.id)
        return token, session

    def lookup(self, token: str) -> Session | None:
        """The live session behind a cookie token: not ended, not expired, its user still a
        member of its organization (else None)."""
        if not token or len(token) > 256:
            return None
        row = self._row(
            sa.and_(
                dashboard_sessions.c.token_hash == _digest(token),
                dashboard_sessions.c.ended_at.is_(None),
                dashboard_sessions.c.expires_at > self._clock(),
            )
        )
        if row is None or row["role"] is None:
            return None
        org = OrgRole(row["org_id"], row["org_name"], row["role"])
        return Session(
            id=row["session_id"],
            user_id=row["user_id"],
            user_name=row["user_name"],
            org=org,
            orgs=self._orgs_of(row["user_id"]),
            csrf_token=row["csrf_token"],
            expires_at=as_utc(row["expires_at"]),
            principal=member_principal(row, key_id=row["session_id"], scopes=ALL_SCOPES),
        )

    def _row(self, where: Any) -> sa.RowMapping | None:
        s = dashboard_sessions.c
        query = (
            sa.select(
                s.id.label("session_id"),
                s.user_id,
                s.org_id,
                s.csrf_token,
                s.expires_at,
                users.c.name.label("user_name"),
                orgs.c.name.label("org_name"),
                *MEMBER_COLUMNS,
            )
            .join(users, users.c.id == s.user_id)
            .join(orgs, orgs.c.id == s.org_id)
            .outerjoin(
                memberships,
                sa.and_(memberships.c.user_id == s.user_id, memberships.c.org_id == s.org_id),
            )
            .where(where)
        )
        with self._db.connect() as conn:
            return conn.execute(query).mappings().first()

    def _orgs_of(self, user_id: str) -> tuple[OrgRole, ...]:
        query = (
            sa.select(orgs.c.id, orgs.c.name, memberships.c.role)
            .join(memberships, memberships.c.org_id == orgs.c.id)
            .where(memberships.c.user_id == user_id)
            .order_by(orgs.c.name)
        )
        with self._db.connect() as conn:
            return tuple(OrgRole(r.id, r.name, r.role) for r in conn.execute(query))

    def switch_org(self, session: Session, org_id: str) -> Session:
        """Move the session to another of its user's organizations (404 otherwise: another
        organization's existence is not revealed)."""
        if all(o.id != org_id for o in session.orgs):
            raise NotFoundError(
                "You are not a member of that organization.", code="org_not_found", param="org_id"
            )
        with self._db.begin() as conn:
            conn.execute(
                sa.update(dashboard_sessions)
                .where(dashboard_sessions.c.id == session.id)
                .values(org_id=org_id)
            )
        org = next(o for o in session.orgs if o.id == org_id)
        principal = self.principal_for_key_id(session.id)
        if principal is None:  # the membership ended in between
            raise NotFoundError(
                "You are not a member of that organization.", code="org_not_found", param="org_id"
            )
        return replace(session, org=org, principal=principal)

    def end(self, session_id: str) -> None:
        with self._db.begin() as conn:
            self._end_where(conn, dashboard_sessions.c.id == session_id)

    def end_user_sessions(self, user_id: str, *, org_id: str | None = None) -> int:
        """End the user's sessions (in ``org_id`` only, when given); how many ended."""
        where = dashboard_sessions.c.user_id == user_id
        if org_id is not None:
            where = sa.and_(where, dashboard_sessions.c.org_id == org_id)
        with self._db.begin() as conn:
            return self._end_where(conn, where)

    def _end_where(self, conn: sa.Connection, where: Any, keep: str | None = None) -> int:
        if keep is not None:
            where = sa.and_(where, dashboard_sessions.c.id != keep)
        ended = conn.execute(
            sa.update(dashboard_sessions)
            .where(where, dashboard_sessions.c.ended_at.is_(None))
            .values(ended_at=self._clock())
        )
        return int(ended.rowcount or 0)

    def principal_for_key_id(self, key_id: str) -> Principal | None:
        """The batch worker's lookup: a session's principal while its user is a member of
        the session's organization (ended or expired sessions included: a batch outlives
        the session that made it); any other id is an API key's (``AccountStore``)."""
        if not key_id.startswith(SESSION_KEY_PREFIX):
            return self._accounts.principal_for_key_id(key_id)
        row = self._row(dashboard_sessions.c.id == key_id)
        if row is None or row["role"] is None:
            return None
        return member_principal(row, key_id=key_id, scopes=ALL_SCOPES)

    # ---- one-time sign-in links --------------------------------------------
    def create_login_token(self, username: str) -> str:
        """A single-use sign-in token for the user, valid ``link_ttl_s``; only its hash is
        stored."""
        token = secrets.token_urlsafe(32)
        now = self._clock()
        with self._db.begin() as conn:
            user_id = conn.execute(sa.select(users.c.id).where(users.c.name == username)).scalar()
            if user_id is None:
                raise NotFoundError(
                    f"No user named {username!r}.", code="user_not_found", param="user"
                )
            conn.execute(
                sa.insert(login_tokens).values(
                    token_hash=_digest(token),
                    user_id=user_id,
                    created_at=now,
                    expires_at=now + self._link_ttl,
                )
            )
        return token

    def redeem_login_token(self, token: str) -> str | None:
        """The user id of an unused, unexpired token, marking it used in the same
        statement (two concurrent redemptions: one wins); None otherwise."""
        if not token or len(token) > 256:
            return None
        now = self._clock()
        t = login_tokens.c
        claim = (
            sa.update(login_tokens)
            .where(t.token_hash == _digest(token), t.used_at.is_(None), t.expires_at > now)
            .values(used_at=now)
            .returning(t.user_id)
        )
        with self._db.begin() as conn:
            user_id = conn.execute(claim).scalar()
        return None if user_id is None else str(user_id)

    def ttl_seconds(self) -> int:
        return int(self._ttl.total_seconds())
