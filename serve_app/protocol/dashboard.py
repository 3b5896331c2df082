"""Wire formats of the dashboard's session-only API (docs/reference/dashboard.md).

Request bodies refuse unknown fields and coerce nothing (a string is not a number), as
the rest of the API does; answers are plain models so the OpenAPI document shows them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from serve_app.protocol.common import JsonBool, WholeInt

Role = Literal["member", "admin"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- session -------------------------------------------------------------------
class SignInRequest(_Body):
    username: StrictStr = Field(min_length=1, max_length=128)
    password: StrictStr = Field(min_length=1, max_length=1024)


class SwitchOrgRequest(_Body):
    org_id: StrictStr = Field(min_length=1, max_length=128)


class PasswordChangeRequest(_Body):
    current_password: StrictStr = Field(min_length=1, max_length=1024)
    new_password: StrictStr = Field(min_length=1, max_length=1024)


class SessionUser(BaseModel):
    id: str
    name: str


class SessionOrg(BaseModel):
    id: str
    name: str
    role: Role


class SessionObject(BaseModel):
    """The signed-in user, the current organization and the token writes must echo."""

    user: SessionUser
    org: SessionOrg
    orgs: list[SessionOrg] = Field(description="Every organization the user belongs to.")
    csrf_token: str = Field(description="Send it as X-CSRF-Token on every POST/PATCH/DELETE.")
    expires_at: int = Field(description="Unix seconds; sign in again after it.")


# ---- keys ----------------------------------------------------------------------
class KeyCreateRequest(_Body):
    name: StrictStr = Field(min_length=1, max_length=128)
    scopes: list[StrictStr] | None = Field(
        default=None, description="Scope names (inference, dedicated); default: all."
    )
    expires_at: WholeInt | None = Field(
        default=None, ge=1, description="Unix seconds; null or absent: never expires."
    )


class KeyObject(BaseModel):
    id: str
    name: str | None
    prefix: str = Field(description="The characters after gwk_ that tell keys apart.")
    scopes: list[str]
    user_id: str
    user_name: str
    created_at: int
    expires_at: int | None
    last_used_at: int | None = Field(description="To within a minute.")
    revoked_at: int | None


class CreatedKeyObject(KeyObject):
    key: str = Field(description="The key itself: shown this once, never again.")


class KeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[KeyObject]


# ---- organization --------------------------------------------------------------
class OrgFlags(BaseModel):
    web_search_enabled: bool
    web_fetch_enabled: bool
    code_interpreter_enabled: bool
    external_providers_enabled: bool


class OrgFlagsUpdate(_Body):
    web_search_enabled: JsonBool | None = None
    web_fetch_enabled: JsonBool | None = None
    code_interpreter_enabled: JsonBool | None = None
    external_providers_enabled: JsonBool | None = None


class MemberObject(BaseModel):
    user_id: str
    name: str
    role: Role


class OrgObject(BaseModel):
    id: str
    name: str
    role: Role = Field(description="The caller's role in it.")
    flags: OrgFlags
    members: list[MemberObject]


class MemberAddRequest(_Body):
    username: StrictStr = Field(min_length=1, max_length=128)
    role: Role = "member"
    password: StrictStr | None = Field(
        default=None,
        max_length=1024,
        description="Creates the user with this password when no user has that name.",
    )


class MemberRoleRequest(_Body):
    role: Role


# ---- billing -------------------------------------------------------------------
class UsageRow(BaseModel):
    group: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: float


class UsageTotal(BaseModel):
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: float


class UsageReport(BaseModel):
    object: Literal["list"] = "list"
    group_by: Literal["day", "model", "key", "user"]
    start: str = Field(description="First day (UTC), inclusive.")
    end: str = Field(description="Last day (UTC), inclusive.")
    data: list[UsageRow]
    total: UsageTotal


class DailyQuota(BaseModel):
    limit: int | None
    used: int
    remaining: int | None


class QuotaObject(BaseModel):
    daily_tokens: DailyQuota
    rpm: int | None
    tpm: int | None


# ---- admin ---------------------------------------------------------------------
class RayDashboardObject(BaseModel):
    url: str = Field(description="The Ray dashboard, with its token when one is known.")
    token_hint: str = Field(description="Where the token is, for a browser that asks for it.")
