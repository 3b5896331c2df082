"""Who is calling: the value every route receives after authentication.

A frozen dataclass of plain values so it can cross a DeploymentHandle and be
handed to limits and billing without them knowing about the database.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Scope names (docs/reference/common.md#scopes-and-session-only-routes).
SCOPE_INFERENCE = "inference"  # every route under /v1
SCOPE_DEDICATED = "dedicated"  # every route under /api/dedicated
ALL_SCOPES: frozenset[str] = frozenset({SCOPE_INFERENCE, SCOPE_DEDICATED})

ROLE_MEMBER = "member"
ROLE_ADMIN = "admin"
ROLES: frozenset[str] = frozenset({ROLE_MEMBER, ROLE_ADMIN})


@dataclass(frozen=True)
class UserLimits:
    """Per-user overrides; ``None`` means the platform default governs."""

    rpm: int | None = None
    tpm: int | None = None
    daily_tokens: int | None = None


@dataclass(frozen=True)
class Principal:
    """An authenticated API key together with its user and organization."""

    key_id: str
    user_id: str
    org_id: str
    role: str
    scopes: frozenset[str]
    web_search_enabled: bool = False
    web_fetch_enabled: bool = False
    code_interpreter_enabled: bool = False
    external_providers_enabled: bool = False
    org_internal: bool = False
    user_limits: UserLimits = field(default_factory=UserLimits)
    key_rpm: int | None = None
    key_tpm: int | None = None
    key_expires_at: float | None = None
    """When the key stops working (seconds since the epoch); None: never."""
