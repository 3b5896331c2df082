"""Which gateway user an OpenID Connect sign-in is (docs/dashboard.md, "Signing in
with OpenID Connect").

The claim's value is matched to a user's name; an email is matched without regard to
case (``Alice@Example.com`` and ``alice@example.com`` are one mailbox for every provider
in practice), and two users whose names differ only in case make the sign-in refused
rather than guessed. A user who does not exist is refused unless the configuration
creates first-time users, and then only as a member of the one organization it names,
which must exist already: a typo in the file must not create an organization.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import sqlalchemy as sa

from serve_app.auth.accounts import AccountStore
from serve_app.auth.oidc import OidcClient, OidcError
from serve_app.auth.oidc_config import OidcOptions
from serve_app.auth.principal import ROLE_MEMBER
from serve_app.storage.schema import users

logger = logging.getLogger(__name__)


class OidcUsers:
    def __init__(self, accounts: AccountStore, options: OidcOptions) -> None:
        self._accounts = accounts
        self._options = options

    def resolve(self, name: str) -> str:
        """The user id for the claim's value, creating the user when configured to;
        ``unknown_user`` otherwise."""
        by_email = self._options.user_claim == "email"
        column = sa.func.lower(users.c.name) if by_email else users.c.name
        wanted = name.lower() if by_email else name
        with self._accounts.database.connect() as conn:
            found = conn.execute(sa.select(users.c.id).where(column == wanted).limit(2)).all()
        if len(found) == 1:
            return str(found[0].id)
        if found:
            raise OidcError("unknown_user", f"several users are named {name!r} up to case")
        return self._create(wanted)

    def _create(self, name: str) -> str:
        create = self._options.create_users
        if create is None:
            raise OidcError(
                "unknown_user",
                f"no user named {name!r} (dashboard.oidc.create_users is off: an admin adds "
                "them first)",
            )
        if self._accounts.get_org(create.org) is None:
            raise OidcError(
                "unknown_user", f"dashboard.oidc.create_users.org {create.org!r} does not exist"
            )
        try:
            self._accounts.set_membership(name, create.org, ROLE_MEMBER)
        except Exception as exc:  # an invalid name (InvalidRequestError) or a database error
            raise OidcError("unknown_user", f"cannot create user {name!r}: {exc}") from exc
        user = self._accounts.get_user(name)
        assert user is not None  # just made
        logger.info("OIDC sign-in created user %s as a member of %s", name, create.org)
        return user.id


@dataclass(frozen=True)
class OidcSignIn:
    """The provider and the user mapping, as the sign-in service holds them."""

    client: OidcClient
    users: OidcUsers
