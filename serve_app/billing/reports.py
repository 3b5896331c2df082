"""Usage and spend from the ledger, as the dashboard shows them
(docs/reference/dashboard.md#billing).

Figures are sums over ``usage_records`` (the durable ledger; a request appears once its
spooled record is committed, within the ledger's flush interval) grouped by UTC day,
model, key or user in the SQL database itself. An admin sees the organization's rows, a
member only their own. ``cost_usd`` adds up the price each record was billed at (the
ledger copies it, so a later price change leaves history alone); every catalog price is
in USD.
"""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Literal

import sqlalchemy as sa

from serve_app.protocol.errors import InvalidRequestError
from serve_app.storage.db import Database
from serve_app.storage.schema import usage_records, users

GroupBy = Literal["day", "model", "key", "user"]
DEFAULT_DAYS = 30
MAX_DAYS = 366


@dataclass(frozen=True)
class UsageLine:
    group: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: float


@dataclass(frozen=True)
class UsageSummary:
    group_by: GroupBy
    start: date
    end: date
    lines: list[UsageLine]
    total: UsageLine


@dataclass(frozen=True)
class DailyTokens:
    limit: int | None
    used: int

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.used)


def date_range(start: date | None, end: date | None, today: date) -> tuple[date, date]:
    """The inclusive range asked for; default the last ``DEFAULT_DAYS`` days to today."""
    end = end or today
    start = start or end - timedelta(days=DEFAULT_DAYS - 1)
    if start > end:
        raise InvalidRequestError(
            "start must not be after end.", code="invalid_value", param="start"
        )
    if (end - start).days >= MAX_DAYS:
        raise InvalidRequestError(
            f"A report covers at most {MAX_DAYS} days.", code="invalid_value", param="start"
        )
    return start, end


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


class UsageReports:
    """Aggregates the ledger for one organization (and one user, for a member)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def _group_column(self, group_by: GroupBy) -> Any:
        c = usage_records.c
        if group_by == "model":
            return c.model
        if group_by == "key":
            return c.key_id
        if group_by == "user":
            return sa.func.coalesce(users.c.name, c.user_id)
        if self._db.dialect == "postgresql":
            return sa.func.to_char(sa.func.timezone("UTC", c.created_at), "YYYY-MM-DD")
        return sa.func.date(c.created_at)  # SQLite stores UTC timestamps as ISO text

    def _summarize(
        self, org_id: str, user_id: str | None, start: date, end: date, group_by: GroupBy
    ) -> UsageSummary:
        c = usage_records.c
        group = self._group_column(group_by).label("grp")
        sums = (
            sa.func.coalesce(sa.func.sum(c.requests), 0).label("requests"),
            sa.func.coalesce(sa.func.sum(c.prompt_tokens), 0).label("prompt_tokens"),
            sa.func.coalesce(sa.func.sum(c.completion_tokens), 0).label("completion_tokens"),
            sa.func.coalesce(sa.func.sum(c.cost), 0).label("cost"),
        )
        where = [c.org_id == org_id, c.created_at >= _midnight(start)]
        where.append(c.created_at < _midnight(end + timedelta(days=1)))
        if user_id is not None:
            where.append(c.user_id == user_id)
        query = (
            sa.select(group, *sums)
            .select_from(usage_records.outerjoin(users, users.c.id == c.user_id))
            .where(*where)
            .group_by(group)
            .order_by(group)
        )
        with self._db.connect() as conn:
            lines = [_line(str(row.grp), row) for row in conn.execute(query)]
        return UsageSummary(group_by, start, end, lines, _total(lines))

    async def summarize(
        self,
        org_id: str,
        user_id: str | None,
        start: date | None,
        end: date | None,
        group_by: GroupBy,
    ) -> UsageSummary:
        first, last = date_range(start, end, datetime.now(UTC).date())
        return await asyncio.to_thread(self._summarize, org_id, user_id, first, last, group_by)

    def _tokens_today(self, user_id: str) -> int:
        c = usage_records.c
        today = _midnight(datetime.now(UTC).date())
        query = sa.select(
            sa.func.coalesce(sa.func.sum(c.prompt_tokens + c.completion_tokens), 0)
        ).where(c.user_id == user_id, c.created_at >= today)
        with self._db.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    async def daily_tokens(self, user_id: str, limit: int | None) -> DailyTokens:
        """The user's daily token quota and what the ledger counted today (UTC), in every
        organization: the quota is the user's, as ``serve_app.limits`` enforces it."""
        return DailyTokens(limit, await asyncio.to_thread(self._tokens_today, user_id))


def _line(group: str, row: Any) -> UsageLine:
    prompt, completion = int(row.prompt_tokens), int(row.completion_tokens)
    return UsageLine(
        group=group,
        requests=int(row.requests),
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        cost_usd=round(float(row.cost), 6),
    )


def _total(lines: Sequence[UsageLine]) -> UsageLine:
    return UsageLine(
        group="total",
        requests=sum(line.requests for line in lines),
        prompt_tokens=sum(line.prompt_tokens for line in lines),
        completion_tokens=sum(line.completion_tokens for line in lines),
        total_tokens=sum(line.total_tokens for line in lines),
        cost_usd=round(sum(line.cost_usd for line in lines), 6),
    )


CSV_COLUMNS = tuple(f.name for f in fields(UsageLine))


def _cell(value: object) -> object:
    """A text cell a spreadsheet would read as a formula is quoted with a leading '."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def to_csv(summary: UsageSummary) -> str:
    """The report's rows as CSV, a header first (the group column named after group_by)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((summary.group_by, *CSV_COLUMNS[1:]))
    for line in summary.lines:
        writer.writerow([_cell(getattr(line, name)) for name in CSV_COLUMNS])
    return out.getvalue()
