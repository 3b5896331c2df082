"""The usage ledger's SQL side: idempotent batch inserts and per-model totals.

Inserts use ``ON CONFLICT (request_id) DO NOTHING`` (SQLite and PostgreSQL
alike), which is what makes every replay of the spool safe: a record that was
committed before a crash, then replayed, is stored once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from serve_app.billing.records import UsageRecord
from serve_app.storage.db import Database
from serve_app.storage.schema import usage_records

INSERT_CHUNK = 500


@dataclass(frozen=True)
class ModelTotals:
    """Sums of one user's records for one model and currency."""

    model: str
    currency: str
    records: int
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    web_searches: int
    code_seconds: float
    images: int
    audio_seconds: float
    cost: float
    video_seconds: float = 0.0
    batch: bool = False
    """Batch lines' records (billed at the batch discount) are totalled apart."""


class LedgerStore:
    """Reads and writes ``usage_records``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def _insert(self) -> Any:
        if self._db.dialect == "postgresql":
            return postgresql.insert(usage_records).on_conflict_do_nothing(
                index_elements=["request_id"]
            )
        return sqlite.insert(usage_records).on_conflict_do_nothing(index_elements=["request_id"])

    def insert(self, records: Sequence[UsageRecord]) -> None:
        """Store records in one transaction; ones already stored are skipped."""
        if not records:
            return
        with self._db.begin() as conn:
            self.insert_in(conn, records)

    def insert_in(self, conn: Connection, records: Sequence[UsageRecord]) -> None:
        """Insert-or-ignore inside the caller's transaction (a video job's completion
        and its usage record commit together, so the job is billed exactly once)."""
        rows = [r.to_row() for r in records]
        for start in range(0, len(rows), INSERT_CHUNK):
            conn.execute(self._insert(), rows[start : start + INSERT_CHUNK])

    def get(self, request_id: str) -> UsageRecord | None:
        with self._db.connect() as conn:
            row = (
                conn.execute(
                    sa.select(usage_records).where(usage_records.c.request_id == request_id)
                )
                .mappings()
                .first()
            )
        return None if row is None else UsageRecord(**dict(row))

    def records_for(self, user_id: str) -> list[UsageRecord]:
        """Every record of a user, oldest first (tests and audits)."""
        query = (
            sa.select(usage_records)
            .where(usage_records.c.user_id == user_id)
            .order_by(usage_records.c.created_at, usage_records.c.request_id)
        )
        with self._db.connect() as conn:
            return [UsageRecord(**dict(row)) for row in conn.execute(query).mappings()]

    def tokens_between(self, user_id: str, start: datetime, end: datetime) -> int:
        """Prompt + completion tokens billed to the user in [start, end): what the daily
        quota counted, rebuilt when its counter was lost (``serve_app.limits``)."""
        c = usage_records.c
        query = sa.select(
            sa.func.coalesce(sa.func.sum(c.prompt_tokens + c.completion_tokens), 0)
        ).where(c.user_id == user_id, c.created_at >= start, c.created_at < end)
        with self._db.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    def totals(self, user_id: str, since: datetime | None = None) -> list[ModelTotals]:
        """Per model, currency and live/batch, ordered by model (live first)."""
        c = usage_records.c
        batch = sa.case((c.batch_id.is_(None), 0), else_=1).label("batch")

        def total(column: Any) -> Any:
            return sa.func.coalesce(sa.func.sum(column), 0)

        query = sa.select(
            c.model,
            c.currency,
            batch,
            sa.func.count().label("records"),
            *(
                total(getattr(c, name)).label(name)
                for name in (
                    "requests",
                    "prompt_tokens",
                    "completion_tokens",
                    "cached_tokens",
                    "reasoning_tokens",
                    "web_searches",
                    "code_seconds",
                    "images",
                    "audio_seconds",
                    "video_seconds",
                    "cost",
                )
            ),
        ).where(c.user_id == user_id)
        if since is not None:
            query = query.where(c.created_at >= since)
        query = query.group_by(c.model, c.currency, batch).order_by(c.model, c.currency, batch)
        with self._db.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [_totals(row) for row in rows]


def _totals(row: Any) -> ModelTotals:
    return ModelTotals(
        model=row["model"],
        currency=row["currency"],
        records=int(row["records"]),
        requests=int(row["requests"]),
        prompt_tokens=int(row["prompt_tokens"]),
        completion_tokens=int(row["completion_tokens"]),
        cached_tokens=int(row["cached_tokens"]),
        reasoning_tokens=int(row["reasoning_tokens"]),
        web_searches=int(row["web_searches"]),
        code_seconds=float(row["code_seconds"]),
        images=int(row["images"]),
        audio_seconds=float(row["audio_seconds"]),
        cost=float(row["cost"]),
        video_seconds=float(row["video_seconds"]),
        batch=bool(row["batch"]),
    )
