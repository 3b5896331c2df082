"""The OpenID Connect authorization code flow with PKCE, for the dashboard's sign-in
(docs/dashboard.md, "Signing in with OpenID Connect").

Authlib does the protocol: the authorization URL (state, nonce, S256 code challenge),
the code exchange at the token endpoint, and the ID token's claims (``iss``, ``aud``,
``exp``, ``iat``, ``nonce``, ``azp``, ``at_hash``) once joserfc has checked its signature
against the provider's published keys. This module adds only what a gateway with several
replicas needs around it:

- the flow's secrets (state, nonce, code verifier, where to return) travel in a signed,
  ten-minute, ``HttpOnly`` cookie rather than in one replica's memory, so the callback
  may land on any replica. Its HMAC key is derived from the client secret, which every
  replica has and nobody else does but the provider. The cookie is bound to the browser
  that started the flow, which is what defeats login CSRF: a code minted for an
  attacker's browser carries a state this browser never saw.
- discovery and the key set are fetched once per ``metadata_ttl_s`` per replica, and the
  keys again at once when a token names a key id not in them (the provider rotated).
- the token's signing algorithm must be an asymmetric one the provider announces: never
  ``none``, never an HMAC keyed by the (shared) client secret.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from authlib.integrations.httpx_client import AsyncOAuth2Client
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet, OctKey

from serve_app.auth.oidc_config import OidcOptions

logger = logging.getLogger(__name__)

FLOW_TTL_S = 600
"""How long a started sign-in may take at the provider before its cookie is refused."""
ASYMMETRIC_ALGS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
_FLOW_PURPOSE = b"inference-gateway dashboard oidc flow v1"


class OidcError(Exception):
    """A refused OpenID Connect sign-in: ``code`` is shown to the person (the sign-in
    page has a sentence for each), ``reason`` only goes to the log."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class Flow:
    """What the callback needs from the start of the same browser's sign-in."""

    state: str
    nonce: str
    code_verifier: str
    redirect_uri: str
    next_path: str


@dataclass
class _Cached:
    value: dict[str, Any]
    at: float


class OidcClient:
    """One provider. ``clock`` (seconds) is injectable so tests can expire a flow."""

    def __init__(
        self, options: OidcOptions, client_secret: str, *, clock: Callable[[], float] = time.time
    ) -> None:
        if not client_secret:
            raise ValueError(f"{options.client_secret_env} is empty: OIDC sign-in needs it")
        self.options = options
        self._secret = client_secret
        self._clock = clock
        self._flow_key = OctKey.import_key(
            hmac.new(client_secret.encode(), _FLOW_PURPOSE, hashlib.sha256).digest()
        )
        self._metadata: _Cached | None = None
        self._jwks: _Cached | None = None

    @property
    def name(self) -> str:
        return self.options.name

    # ---- the provider's documents ----------------------------------------
    def _http(self) -> AsyncOAuth2Client:
        return AsyncOAuth2Client(
            client_id=self.options.client_id,
            client_secret=self._secret,
            token_endpoint_auth_method=self.options.token_endpoint_auth_method,
            scope=" ".join(self.options.scopes),
            code_challenge_method="S256",
            timeout=self.options.timeout_s,
        )

    def _fresh(self, cached: _Cached | None) -> bool:
        return cached is not None and self._clock() - cached.at < self.options.metadata_ttl_s

    async def _get_json(self, url: str) -> dict[str, Any]:
        try:
            async with httpx.AsyncClient(timeout=self.options.timeout_s) as http:
                answer = await http.get(url, headers={"Accept": "application/json"})
                answer.raise_for_status()
                body = answer.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise OidcError("provider_unavailable", f"GET {url}: {exc}") from exc
        if not isinstance(body, dict):
            raise OidcError("provider_unavailable", f"GET {url}: not a JSON object")
        return body

    async def metadata(self) -> dict[str, Any]:
        """The discovery document, checked to be this issuer's (OpenID Connect Discovery
        4.3: its ``issuer`` must be exactly the configured one)."""
        if self._metadata is not None and self._fresh(self._metadata):
            return self._metadata.value
        found = await self._get_json(self.options.resolved_discovery_url())
        if found.get("issuer") != self.options.issuer:
            raise OidcError(
                "provider_unavailable",
                f"discovery names issuer {found.get('issuer')!r}, not {self.options.issuer!r}",
            )
        for field in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(found.get(field), str):
                raise OidcError("provider_unavailable", f"discovery has no {field}")
        self._metadata = _Cached(found, self._clock())
        return found

    async def _keys(self, *, force: bool = False) -> KeySet:
        if force or self._jwks is None or not self._fresh(self._jwks):
            url = (await self.metadata())["jwks_uri"]
            self._jwks = _Cached(await self._get_json(url), self._clock())
        try:
            return KeySet.import_key_set(self._jwks.value)  # type: ignore[arg-type]
        except (JoseError, ValueError, KeyError, TypeError) as exc:
            raise OidcError("provider_unavailable", f"unusable key set: {exc}") from exc

    # ---- start ---------------------------------------------------------------
    async def begin(self, redirect_uri: str, next_path: str) -> tuple[str, str]:
        """(the provider's authorization URL, the sealed flow for the browser's cookie)."""
        metadata = await self.metadata()
        flow = Flow(
            state=secrets.token_urlsafe(32),
            nonce=secrets.token_urlsafe(32),
            code_verifier=secrets.token_urlsafe(48),
            redirect_uri=redirect_uri,
            next_path=next_path,
        )
        async with self._http() as client:
            url, _ = client.create_authorization_url(
                metadata["authorization_endpoint"],
                state=flow.state,
                nonce=flow.nonce,
                code_verifier=flow.code_verifier,
                redirect_uri=redirect_uri,
            )
        return str(url), self._seal(flow)

    def _seal(self, flow: Flow) -> str:
        now = int(self._clock())
        claims = {**flow.__dict__, "iat": now, "exp": now + FLOW_TTL_S}
        return jwt.encode({"alg": "HS256"}, claims, self._flow_key)

    def unseal(self, sealed: str | None) -> Flow:
        """The flow this browser started, or ``invalid_state`` (missing, forged, expired)."""
        if not sealed:
            raise OidcError("invalid_state", "no sign-in in progress in this browser")
        try:
            token = jwt.decode(sealed, self._flow_key, algorithms=["HS256"])
            jwt.JWTClaimsRegistry(now=int(self._clock()), exp={"essential": True}).validate(
                token.claims
            )
            fields = {k: str(token.claims[k]) for k in Flow.__dataclass_fields__}
        except (JoseError, ValueError, KeyError) as exc:
            raise OidcError("invalid_state", f"flow cookie refused: {exc}") from exc
        return Flow(**fields)

    # ---- callback --------------------------------------------------------------
    async def complete(
        self, sealed: str | None, params: Mapping[str, str]
    ) -> tuple[Flow, dict[str, Any]]:
        """The browser's flow and the validated ID token claims of a callback, or an
        ``OidcError``."""
        flow = self.unseal(sealed)
        if not hmac.compare_digest(params.get("state", "").encode(), flow.state.encode()):
            raise OidcError("invalid_state", "the callback's state is not this browser's")
        if "error" in params:
            raise OidcError(
                "provider_refused",
                f"{params['error']}: {params.get('error_description', '')}"[:300],
            )
        code = params.get("code")
        if not code:
            raise OidcError("provider_refused", "the callback carries no code")
        tokens = await self._exchange(code, flow)
        return flow, await self._id_claims(tokens, flow)

    async def _exchange(self, code: str, flow: Flow) -> dict[str, Any]:
        endpoint = (await self.metadata())["token_endpoint"]
        try:
            async with self._http() as client:
                tokens = await client.fetch_token(
                    endpoint,
                    grant_type="authorization_code",
                    code=code,
                    redirect_uri=flow.redirect_uri,
                    code_verifier=flow.code_verifier,
                )
        except Exception as exc:  # authlib's OAuthError, httpx errors, a non-JSON answer
            raise OidcError("provider_refused", f"code exchange failed: {exc}") from exc
        if not isinstance(tokens.get("id_token"), str):
            raise OidcError("invalid_id_token", "the token endpoint returned no id_token")
        return dict(tokens)

    async def _id_claims(self, tokens: dict[str, Any], flow: Flow) -> dict[str, Any]:
        metadata = await self.metadata()
        announced = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = sorted(ASYMMETRIC_ALGS.intersection(announced))
        try:
            try:
                token = jwt.decode(tokens["id_token"], await self._keys(), algorithms=algorithms)
            except InvalidKeyIdError:  # a key the provider added since we fetched the set
                keys = await self._keys(force=True)
                token = jwt.decode(tokens["id_token"], keys, algorithms=algorithms)
            claims = CodeIDToken(
                token.claims,
                token.header,
                {
                    "iss": {"essential": True, "value": self.options.issuer},
                    "aud": {"essential": True, "value": self.options.client_id},
                    "nonce": {"essential": True, "value": flow.nonce},
                },
                {
                    "nonce": flow.nonce,
                    "client_id": self.options.client_id,
                    "access_token": tokens.get("access_token"),
                },
            )
            claims.validate(now=int(self._clock()), leeway=self.options.leeway_s)
        except OidcError:
            raise
        except (JoseError, ValueError, KeyError, TypeError) as exc:
            raise OidcError("invalid_id_token", f"{type(exc).__name__}: {exc}") from exc
        return dict(claims)

    # ---- who signed in ---------------------------------------------------------
    def user_name(self, claims: Mapping[str, Any]) -> str:
        """The gateway user name the claims name, after the email rules; ``email_not_allowed``
        when they are not met."""
        options = self.options
        email = claims.get("email")
        uses_email = options.user_claim == "email" or bool(options.allowed_email_domains)
        if uses_email:
            if not isinstance(email, str) or "@" not in email:
                raise OidcError("email_not_allowed", "the ID token carries no email")
            if options.require_verified_email and claims.get("email_verified") is not True:
                raise OidcError("email_not_allowed", f"{email} is not verified by the provider")
            domain = email.rsplit("@", 1)[1].lower()
            if options.allowed_email_domains and domain not in options.allowed_email_domains:
                raise OidcError("email_not_allowed", f"{email}: domain {domain} not allowed")
        value = claims.get(options.user_claim)
        if not isinstance(value, str) or not value:
            raise OidcError("unknown_user", f"the ID token has no {options.user_claim} claim")
        return value
