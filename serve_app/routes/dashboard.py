"""The session-only API: keys, the organization, billing, admin
(docs/reference/dashboard.md). Thin: the services are ``serve_app.auth.key_admin``,
``serve_app.auth.members`` and ``serve_app.billing.reports``.

Every route takes a dashboard session (``SessionCaller``: an API key is 403
``session_required``, no credential 401, a write without the CSRF token 403
``csrf_failed``); organization writes take an admin's (``AdminSession``).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import date
from typing import Annotated

from fastapi import APIRouter, Query, Response

from serve_app.auth.principal import ROLE_ADMIN
from serve_app.auth.sessions import Session
from serve_app.billing.reports import GroupBy, UsageSummary, to_csv
from serve_app.protocol.dashboard import (
    CreatedKeyObject,
    DailyQuota,
    KeyCreateRequest,
    KeyList,
    KeyObject,
    MemberAddRequest,
    MemberObject,
    MemberRoleRequest,
    OrgFlagsUpdate,
    OrgObject,
    QuotaObject,
    RayDashboardObject,
    UsageReport,
)
from serve_app.protocol.errors import PermissionDeniedError
from serve_app.ray_dashboard import ray_dashboard
from serve_app.requests.deps import AdminSession, Dashboard, SessionCaller
from serve_app.requests.openapi import ERROR_RESPONSES

router = APIRouter(prefix="/api", tags=["dashboard (session only)"])


# ---- keys ------------------------------------------------------------------------
@router.get(
    "/keys",
    response_model=KeyList,
    responses=ERROR_RESPONSES,
    summary="API keys of the organization (a member: their own), without secrets",
)
async def list_keys(session: SessionCaller, dashboard: Dashboard) -> KeyList:
    records = await dashboard.keys.list(session)
    return KeyList(data=[KeyObject(**asdict(r)) for r in records])


@router.post(
    "/keys",
    status_code=201,
    response_model=CreatedKeyObject,
    responses=ERROR_RESPONSES,
    summary="Create a key for the signed-in user (the key is shown once)",
)
async def create_key(
    body: KeyCreateRequest, session: SessionCaller, dashboard: Dashboard
) -> CreatedKeyObject:
    raw, record = await dashboard.keys.create(session, body.name, body.scopes, body.expires_at)
    return CreatedKeyObject(**asdict(record), key=raw)


@router.delete(
    "/keys/{key_id}",
    response_model=KeyObject,
    responses=ERROR_RESPONSES,
    summary="Revoke a key: refused at once on every replica",
)
async def revoke_key(key_id: str, session: SessionCaller, dashboard: Dashboard) -> KeyObject:
    return KeyObject(**asdict(await dashboard.keys.revoke(session, key_id)))


# ---- organization --------------------------------------------------------------------
async def _org(session: Session, dashboard: Dashboard) -> OrgObject:
    view = await dashboard.members.view(session)
    return OrgObject.model_validate({**asdict(view), "members": [asdict(m) for m in view.members]})


@router.get(
    "/orgs/current",
    response_model=OrgObject,
    responses=ERROR_RESPONSES,
    summary="The session's organization: switches and members",
)
async def current_org(session: SessionCaller, dashboard: Dashboard) -> OrgObject:
    return await _org(session, dashboard)


@router.patch(
    "/orgs/current",
    response_model=OrgObject,
    responses=ERROR_RESPONSES,
    summary="Turn the organization's switches on or off (admins)",
)
async def update_org(
    body: OrgFlagsUpdate, session: AdminSession, dashboard: Dashboard
) -> OrgObject:
    await dashboard.members.update_flags(session, body.model_dump(exclude_none=True))
    return await _org(session, dashboard)


@router.post(
    "/orgs/current/members",
    status_code=201,
    response_model=MemberObject,
    responses=ERROR_RESPONSES,
    summary="Add a user to the organization, creating them when new (admins)",
)
async def add_member(
    body: MemberAddRequest, session: AdminSession, dashboard: Dashboard
) -> MemberObject:
    member = await dashboard.members.add(session, body.username, body.role, body.password)
    return MemberObject.model_validate(asdict(member))


@router.patch(
    "/orgs/current/members/{user_id}",
    response_model=MemberObject,
    responses=ERROR_RESPONSES,
    summary="Change a member's role (admins)",
)
async def set_member_role(
    user_id: str, body: MemberRoleRequest, session: AdminSession, dashboard: Dashboard
) -> MemberObject:
    member = await dashboard.members.set_role(session, user_id, body.role)
    return MemberObject.model_validate(asdict(member))


@router.delete(
    "/orgs/current/members/{user_id}",
    status_code=204,
    response_class=Response,
    responses=ERROR_RESPONSES,
    summary="Remove a member: their keys here are revoked, their sessions here end (admins)",
)
async def remove_member(user_id: str, session: AdminSession, dashboard: Dashboard) -> Response:
    await dashboard.members.remove(session, user_id)
    return Response(status_code=204)


# ---- billing ---------------------------------------------------------------------
async def _usage(
    session: Session, dashboard: Dashboard, start: date | None, end: date | None, by: GroupBy
) -> UsageSummary:
    """An admin sees the organization's usage, a member only their own."""
    user = None if session.org.role == ROLE_ADMIN else session.user_id
    return await dashboard.usage.summarize(session.org.id, user, start, end, by)


Start = Annotated[date | None, Query(description="First UTC day (default: 29 days ago).")]
End = Annotated[date | None, Query(description="Last UTC day, inclusive (default: today).")]
By = Annotated[GroupBy, Query()]


@router.get(
    "/billing/usage",
    response_model=UsageReport,
    responses=ERROR_RESPONSES,
    summary="Usage and spend from the ledger, by day, model, key or user",
)
async def usage(
    session: SessionCaller,
    dashboard: Dashboard,
    start: Start = None,
    end: End = None,
    group_by: By = "day",
) -> UsageReport:
    summary = await _usage(session, dashboard, start, end, group_by)
    total = asdict(summary.total)
    total.pop("group")
    return UsageReport.model_validate(
        {
            "group_by": summary.group_by,
            "start": summary.start.isoformat(),
            "end": summary.end.isoformat(),
            "data": [asdict(line) for line in summary.lines],
            "total": total,
        }
    )


@router.get(
    "/billing/usage.csv",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}}, **ERROR_RESPONSES},
    summary="The same report as CSV",
)
async def usage_csv(
    session: SessionCaller,
    dashboard: Dashboard,
    start: Start = None,
    end: End = None,
    group_by: By = "day",
) -> Response:
    summary = await _usage(session, dashboard, start, end, group_by)
    filename = f"usage-{summary.start}-{summary.end}-{summary.group_by}.csv"
    return Response(
        to_csv(summary),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


@router.get(
    "/billing/quotas",
    response_model=QuotaObject,
    responses=ERROR_RESPONSES,
    summary="The signed-in user's limits and what is left of today's token quota",
)
async def quotas(session: SessionCaller, dashboard: Dashboard) -> QuotaObject:
    limits = session.principal.user_limits
    defaults = dashboard.platform_limits
    daily = await dashboard.usage.daily_tokens(
        session.user_id, _first(limits.daily_tokens, defaults.daily_tokens)
    )
    return QuotaObject(
        daily_tokens=DailyQuota(limit=daily.limit, used=daily.used, remaining=daily.remaining),
        rpm=_first(limits.rpm, defaults.rpm),
        tpm=_first(limits.tpm, defaults.tpm),
    )


def _first(own: int | None, default: int | None) -> int | None:
    """The user's own limit, else the platform's (``serve_app.limits.limiter``)."""
    return own if own is not None else default


# ---- platform admin --------------------------------------------------------------
@router.get(
    "/admin/ray-dashboard",
    response_model=RayDashboardObject,
    responses=ERROR_RESPONSES,
    summary="Where the Ray dashboard is and where its token is (platform admins)",
)
async def ray_dashboard_link(session: SessionCaller) -> RayDashboardObject:
    if not (session.principal.org_internal and session.org.role == ROLE_ADMIN):
        raise PermissionDeniedError(
            "Only platform admins (admins of an internal organization) may do this.",
            code="insufficient_permissions",
        )
    info = ray_dashboard()
    return RayDashboardObject(url=info.url, token_hint=info.token_hint)
