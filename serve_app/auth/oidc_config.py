"""OpenID Connect sign-in, as the Serve config's ``args.dashboard.oidc`` declares it
(docs/dashboard.md, "Signing in with OpenID Connect").

The provider's endpoints come from its discovery document; only what the provider cannot
tell (who this gateway is to it, and who may sign in) is configured. The client secret is
never in the file: the file names the environment variable that holds it, like an
external provider's API key.

Who may sign in is decided here, and the default is the safe one: only a user who exists
already, matched by a claim the provider vouches for (a verified ``email`` by default) to
the user's name. ``create_users`` opts in to creating a first-time user, always as a
*member* of one named organization (never an admin: an identity provider's account is not
a grant of power over an organization).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_SECRET_ENV = "GATEWAY_OIDC_CLIENT_SECRET"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _http_url(value: str, what: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an http(s) URL, got {value!r}")
    return value


class CreateUsers(_Strict):
    """A first-time user is created as a member of this (existing) organization."""

    org: str = Field(min_length=1, description="Name of the organization they join.")
    role: Literal["member"] = Field(
        default="member", description="Always member: an admin makes admins from the console."
    )


class OidcOptions(_Strict):
    """One OpenID Connect provider (authorization code flow with PKCE)."""

    name: str = Field(
        min_length=1, max_length=60, description='Shown on the button: "Sign in with <name>".'
    )
    issuer: str = Field(
        description="The provider's issuer URL (https in production); the ID token's `iss` "
        "must equal it."
    )
    discovery_url: str | None = Field(
        default=None,
        description="Unset: <issuer>/.well-known/openid-configuration.",
    )
    client_id: str = Field(min_length=1, description="This gateway's client id at the provider.")
    client_secret_env: str = Field(
        default=DEFAULT_SECRET_ENV,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="Environment variable holding the client secret (never in the file).",
    )
    redirect_uri: str | None = Field(
        default=None,
        description="Registered at the provider; unset: <the request's origin>"
        "/api/session/oidc/callback. Set it behind a proxy that rewrites the host.",
    )
    scopes: list[str] = Field(
        default_factory=lambda: ["openid", "email", "profile"],
        description="Requested scopes; must include openid.",
    )
    user_claim: str = Field(
        default="email",
        min_length=1,
        description="The ID token claim whose value is the gateway user's name. Use a claim "
        "the provider controls (email, verified; or sub), never one users can edit.",
    )
    allowed_email_domains: list[str] = Field(
        default_factory=list,
        description="When set, the token's verified email must be in one of these domains.",
    )
    require_verified_email: bool = Field(
        default=True,
        description="An email (as the user claim or for the domain check) must carry "
        "email_verified: true.",
    )
    create_users: CreateUsers | None = Field(
        default=None,
        description="Unset (default): only users that exist already may sign in. Set: a "
        "first-time user is created as a member of this organization.",
    )
    token_endpoint_auth_method: Literal["client_secret_basic", "client_secret_post"] = Field(
        default="client_secret_basic", description="How the secret is sent to the token endpoint."
    )
    timeout_s: float = Field(default=10.0, gt=0, le=60, description="Per call to the provider.")
    metadata_ttl_s: float = Field(
        default=3600.0, ge=0, description="How long discovery and keys are reused per replica."
    )
    leeway_s: int = Field(default=60, ge=0, le=300, description="Clock skew allowed on exp/iat.")

    @field_validator("issuer")
    @classmethod
    def _issuer_url(cls, value: str) -> str:
        return _http_url(value, "issuer")

    @field_validator("discovery_url", "redirect_uri")
    @classmethod
    def _optional_url(cls, value: str | None) -> str | None:
        return None if value is None else _http_url(value, "the URL")

    @field_validator("scopes")
    @classmethod
    def _has_openid(cls, value: list[str]) -> list[str]:
        if "openid" not in value:
            raise ValueError("scopes must include openid")
        return value

    @field_validator("allowed_email_domains")
    @classmethod
    def _domains(cls, value: list[str]) -> list[str]:
        return [d.strip().lower().lstrip("@") for d in value if d.strip()]

    def resolved_discovery_url(self) -> str:
        return self.discovery_url or (self.issuer.rstrip("/") + "/.well-known/openid-configuration")

    def production_problems(self) -> list[str]:
        """What a production gateway must not run with (``gateway check`` reports them)."""
        problems = []
        for what, url in (
            ("issuer", self.issuer),
            ("discovery_url", self.discovery_url),
            ("redirect_uri", self.redirect_uri),
        ):
            if url is not None and urlsplit(url).scheme != "https":
                problems.append(f"dashboard.oidc.{what} must be https in production: {url}")
        return problems


class DashboardOptions(_Strict):
    """The console's sign-in options (passwords and one-time links need none)."""

    oidc: OidcOptions | None = Field(
        default=None, description="Sign in through an OpenID Connect provider as well."
    )
