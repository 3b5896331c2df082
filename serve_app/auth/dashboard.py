"""Signing in to the dashboard: passwords and links, rate limits, CSRF
(docs/reference/dashboard.md#session).

Sign-in attempts are counted before any password is hashed, per user name and per
client address, in the same counter stores as the API's rate limits
(``serve_app.limits``: Redis when configured, so every replica counts together). A
refused attempt is a 429 ``rate_limit_exceeded`` with ``Retry-After``; the password is
then not even checked, so guessing runs at most at the limit's pace.

CSRF: the cookie is ``SameSite=Lax`` (a cross-site POST carries no cookie in current
browsers), and every state-changing request made with the cookie must also echo the
session's token in ``X-CSRF-Token``, which another site cannot read.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from serve_app.auth.oidc import OidcError
from serve_app.auth.oidc_users import OidcSignIn
from serve_app.auth.sessions import Session, SessionStore, invalid_credentials
from serve_app.limits.buckets import BucketSpec, CounterStore, Denial, SeedNeeded
from serve_app.protocol.errors import AuthenticationError, PermissionDeniedError, RateLimitError

logger = logging.getLogger(__name__)

SESSION_COOKIE = "gw_session"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSRF_HEADER = "X-CSRF-Token"


@dataclass(frozen=True)
class LoginPolicy:
    """Sign-in attempts allowed per window of the counter store (60 s by default)."""

    per_user: int = 10
    per_client: int = 30


def not_signed_in() -> AuthenticationError:
    return AuthenticationError(
        "Sign in to the dashboard first (or send an API key where one is accepted).",
        code="invalid_session",
    )


def require_csrf(session: Session, method: str, token: str | None) -> None:
    """403 ``csrf_failed`` unless a write carries the session's CSRF token."""
    if method.upper() in SAFE_METHODS:
        return
    if token is None or not hmac.compare_digest(token.encode(), session.csrf_token.encode()):
        raise PermissionDeniedError(
            f"This request needs the session's CSRF token in the {CSRF_HEADER} header.",
            code="csrf_failed",
        )


class DashboardSessions:
    """The sign-in service: each method runs the store's database work in a thread."""

    def __init__(
        self,
        store: SessionStore,
        counters: CounterStore,
        policy: LoginPolicy | None = None,
        oidc: OidcSignIn | None = None,
    ) -> None:
        self.store = store
        self.oidc = oidc
        """OpenID Connect sign-in, when the config declares a provider."""
        self._counters = counters
        self._policy = policy or LoginPolicy()

    async def _admit_attempt(self, username: str | None, client: str) -> None:
        """Count an attempt per client, and per user name when there is one to guess."""
        buckets = [BucketSpec("requests", f"login:client:{client}", self._policy.per_client, "key")]
        if username is not None:
            buckets.insert(
                0,
                BucketSpec(
                    "requests", f"login:user:{username.lower()}", self._policy.per_user, "user"
                ),
            )
        outcome = await self._counters.admit(f"login:{client}", buckets, 0)
        if isinstance(outcome, Denial):
            wait = outcome.retry_after_s
            raise RateLimitError(
                f"Too many sign-in attempts; retry after {wait} s.",
                headers={"Retry-After": str(wait)},
            )
        if not isinstance(outcome, SeedNeeded):
            await self._counters.settle(outcome, 0)  # lets the in-process store forget idle logs

    async def sign_in(self, username: str, password: str, client: str) -> tuple[str, Session]:
        """A new session for a correct password: (cookie token, session); 401
        ``invalid_credentials`` otherwise, the same for an unknown user."""
        await self._admit_attempt(username, client)
        user_id = await asyncio.to_thread(self.store.check_password, username, password)
        if user_id is None:
            raise invalid_credentials()
        return await asyncio.to_thread(self.store.start, user_id)

    async def sign_in_with_link(self, token: str, client: str) -> tuple[str, Session]:
        """A new session from a one-time link's token (counted like a password attempt)."""
        await self._admit_attempt("(link)", client)
        user_id = await asyncio.to_thread(self.store.redeem_login_token, token)
        if user_id is None:
            raise AuthenticationError(
                "This sign-in link is unknown, used or expired; ask for a new one.",
                code="invalid_credentials",
            )
        return await asyncio.to_thread(self.store.start, user_id)

    async def sign_in_with_oidc(
        self, sealed: str | None, params: Mapping[str, str], client: str
    ) -> tuple[str, Session, str]:
        """A new session from an OpenID Connect callback: (cookie token, session, the
        console path to return to). Counted per client (nobody guesses a password here;
        the code exchange is what a flood would cost); ``OidcError`` when refused."""
        if self.oidc is None:
            raise OidcError("not_configured", "no OpenID Connect provider is configured")
        await self._admit_attempt(None, client)
        flow, claims = await self.oidc.client.complete(sealed, params)
        name = self.oidc.client.user_name(claims)
        user_id = await asyncio.to_thread(self.oidc.users.resolve, name)
        token, session = await asyncio.to_thread(self.store.start, user_id)
        logger.info("OIDC sign-in of %s (sub %s)", session.user_name, claims.get("sub"))
        return token, session, flow.next_path

    async def current(self, token: str | None) -> Session:
        """The live session of a cookie, or 401 ``invalid_session``."""
        if not token:
            raise not_signed_in()
        session = await asyncio.to_thread(self.store.lookup, token)
        if session is None:
            raise not_signed_in()
        return session

    async def sign_out(self, session: Session) -> None:
        await asyncio.to_thread(self.store.end, session.id)

    async def switch_org(self, session: Session, org_id: str) -> Session:
        return await asyncio.to_thread(self.store.switch_org, session, org_id)

    async def change_password(self, session: Session, current: str, new: str) -> None:
        await asyncio.to_thread(self.store.change_password, session, current, new)

    async def aclose(self) -> None:
        await self._counters.aclose()
