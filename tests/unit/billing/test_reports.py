"""Usage reports from the ledger on both databases (``serve_app.billing.reports``)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from serve_app.billing.reports import UsageReports, date_range, to_csv
from serve_app.billing.store import LedgerStore
from serve_app.protocol.errors import InvalidRequestError
from serve_app.storage.db import Database
from tests.unit.billing.records import make_record

DAY = date(2026, 11, 20)


def _at(day: date, hour: int) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


async def test_grouping_by_day_model_and_key(db: Database) -> None:
    LedgerStore(db).insert(
        [
            make_record("r1", created_at=_at(DAY, 0), model="a"),
            make_record("r2", created_at=_at(DAY, 23), model="b", key_id="key_2"),
            make_record("r3", created_at=_at(DAY + timedelta(1), 1), model="a"),
            make_record("r4", created_at=_at(DAY + timedelta(5), 1), model="a"),  # after end
            make_record("r5", created_at=_at(DAY, 5), org_id="org_other"),
            make_record("r6", created_at=_at(DAY, 6), user_id="usr_2"),
        ]
    )
    reports = UsageReports(db)
    end = DAY + timedelta(1)
    by_day = await reports.summarize("org_1", None, DAY, end, "day")
    assert [(line.group, line.requests) for line in by_day.lines] == [
        (DAY.isoformat(), 3),
        (end.isoformat(), 1),
    ]
    assert by_day.total.total_tokens == 4 * 15
    by_model = await reports.summarize("org_1", "usr_1", DAY, end, "model")
    assert [(line.group, line.requests) for line in by_model.lines] == [("a", 2), ("b", 1)]
    by_key = await reports.summarize("org_1", "usr_1", DAY, end, "key")
    assert {line.group for line in by_key.lines} == {"key_1", "key_2"}
    assert by_key.total.cost_usd == pytest.approx(3 * (10 * 1.0 + 5 * 2.0) / 1e6)
    assert to_csv(by_model).splitlines()[0] == (
        "model,requests,prompt_tokens,completion_tokens,total_tokens,cost_usd"
    )


def test_date_ranges() -> None:
    today = date(2026, 11, 28)
    assert date_range(None, None, today) == (today - timedelta(29), today)
    with pytest.raises(InvalidRequestError):
        date_range(today, today - timedelta(1), today)
    with pytest.raises(InvalidRequestError):
        date_range(today - timedelta(400), today, today)


def test_csv_cells_are_not_formulas() -> None:
    from serve_app.billing.reports import UsageLine, UsageSummary

    line = UsageLine("=cmd()", 1, 1, 1, 2, 0.0)
    text = to_csv(UsageSummary("model", DAY, DAY, [line], line))
    assert "'=cmd()" in text
