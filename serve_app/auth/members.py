"""An organization as its admins run it from the dashboard
(docs/reference/dashboard.md#organization).

Any member reads the organization (its switches, its members); only its admins change
it. Every write goes through ``AccountStore.write``, so the accounts generation moves
and every replica's auth cache is dropped: a changed switch or role applies to the
next request of every key. Removing a member deletes the membership, revokes their
keys in this organization and ends their sessions in it, in one step; the last admin
cannot be removed or demoted (the organization would have nobody to run it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from serve_app.auth.accounts import TOOL_FLAGS, AccountStore
from serve_app.auth.passwords import check_new_password
from serve_app.auth.principal import ROLE_ADMIN, ROLES
from serve_app.auth.sessions import Session, SessionStore
from serve_app.protocol.errors import ConflictError, InvalidRequestError, NotFoundError
from serve_app.storage.schema import api_keys, memberships, orgs, users, utcnow

ORG_FLAGS = (*TOOL_FLAGS, "external_providers_enabled")


@dataclass(frozen=True)
class Member:
    user_id: str
    name: str
    role: str


@dataclass(frozen=True)
class OrgView:
    id: str
    name: str
    role: str
    flags: dict[str, bool]
    members: list[Member]


def _no_member(user_id: str) -> NotFoundError:
    return NotFoundError(
        f"No member {user_id!r} in this organization.", code="member_not_found", param="user_id"
    )


class MemberAdmin:
    """Reads and changes the session's organization (database work in a thread)."""

    def __init__(self, accounts: AccountStore, sessions: SessionStore) -> None:
        self._accounts = accounts
        self._sessions = sessions

    def _members(self, conn: Connection, org_id: str) -> list[Member]:
        query = (
            sa.select(users.c.id, users.c.name, memberships.c.role)
            .join(memberships, memberships.c.user_id == users.c.id)
            .where(memberships.c.org_id == org_id)
            .order_by(users.c.name)
        )
        return [Member(r.id, r.name, r.role) for r in conn.execute(query)]

    def _view(self, session: Session) -> OrgView:
        with self._accounts.database.connect() as conn:
            row = conn.execute(
                sa.select(orgs.c.id, orgs.c.name, *(orgs.c[f] for f in ORG_FLAGS)).where(
                    orgs.c.id == session.org.id
                )
            ).first()
            assert row is not None  # a live session's org exists (foreign key)
            members = self._members(conn, session.org.id)
        flags = {flag: bool(getattr(row, flag)) for flag in ORG_FLAGS}
        return OrgView(row.id, row.name, session.org.role, flags, members)

    async def view(self, session: Session) -> OrgView:
        return await asyncio.to_thread(self._view, session)

    async def update_flags(self, session: Session, changes: Mapping[str, bool]) -> OrgView:
        def update() -> OrgView:
            values = {flag: bool(value) for flag, value in changes.items() if flag in ORG_FLAGS}
            if values:
                with self._accounts.write() as conn:
                    conn.execute(sa.update(orgs).where(orgs.c.id == session.org.id).values(values))
            return self._view(session)

        return await asyncio.to_thread(update)

    async def add(self, session: Session, username: str, role: str, password: str | None) -> Member:
        """Add an existing user, or create one (with ``password`` when given: an admin
        never sets the password of a user who exists already)."""

        def add() -> Member:
            existing = self._accounts.get_user(username)
            if existing is not None and password is not None:
                raise ConflictError(
                    f"A user named {username!r} exists; add them without a password.",
                    code="user_exists",
                    param="password",
                )
            if password is not None:
                check_new_password(password)
            with self._accounts.database.connect() as conn:
                if existing is not None and self._role(conn, existing.id, session) is not None:
                    raise ConflictError(
                        f"{username!r} is a member already.",
                        code="already_member",
                        param="username",
                    )
            self._accounts.set_membership(username, session.org.name, role)
            if password is not None:
                self._sessions.set_password(username, password)
            user = self._accounts.get_user(username)
            assert user is not None  # just made
            return Member(user.id, user.name, role)

        return await asyncio.to_thread(add)

    @staticmethod
    def _role(conn: Connection, user_id: str, session: Session) -> str | None:
        found = conn.execute(
            sa.select(memberships.c.role).where(
                memberships.c.user_id == user_id, memberships.c.org_id == session.org.id
            )
        ).scalar()
        return None if found is None else str(found)

    def _check_admins_left(self, conn: Connection, session: Session, user_id: str) -> None:
        """409 ``last_admin`` when ``user_id`` is the organization's only admin."""
        admins = conn.execute(
            sa.select(memberships.c.user_id).where(
                memberships.c.org_id == session.org.id, memberships.c.role == ROLE_ADMIN
            )
        ).scalars()
        if list(admins) == [user_id]:
            raise ConflictError(
                "The organization's last admin cannot be removed or demoted; "
                "make another member admin first.",
                code="last_admin",
                param="user_id",
            )

    async def set_role(self, session: Session, user_id: str, role: str) -> Member:
        if role not in ROLES:
            raise InvalidRequestError(f"Invalid role {role!r}.", code="invalid_role", param="role")

        def change() -> Member:
            with self._accounts.write() as conn:
                current = self._role(conn, user_id, session)
                if current is None:
                    raise _no_member(user_id)
                if current == ROLE_ADMIN and role != ROLE_ADMIN:
                    self._check_admins_left(conn, session, user_id)
                conn.execute(
                    sa.update(memberships)
                    .where(memberships.c.user_id == user_id, memberships.c.org_id == session.org.id)
                    .values(role=role)
                )
                name = conn.execute(sa.select(users.c.name).where(users.c.id == user_id)).scalar()
            return Member(user_id, str(name), role)

        return await asyncio.to_thread(change)

    async def remove(self, session: Session, user_id: str) -> None:
        """End the membership, revoke the user's keys here, end their sessions here."""

        def remove() -> None:
            with self._accounts.write() as conn:
                current = self._role(conn, user_id, session)
                if current is None:
                    raise _no_member(user_id)
                if current == ROLE_ADMIN:
                    self._check_admins_left(conn, session, user_id)
                here = _member_keys(user_id, session.org.id)
                conn.execute(sa.update(api_keys).where(here).values(revoked_at=utcnow()))
                conn.execute(
                    sa.delete(memberships).where(
                        memberships.c.user_id == user_id, memberships.c.org_id == session.org.id
                    )
                )
            self._sessions.end_user_sessions(user_id, org_id=session.org.id)

        await asyncio.to_thread(remove)


def _member_keys(user_id: str, org_id: str) -> Any:
    return sa.and_(
        api_keys.c.user_id == user_id,
        api_keys.c.org_id == org_id,
        api_keys.c.revoked_at.is_(None),
    )
