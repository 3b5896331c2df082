"""The ``adapters`` table: an organization's uploaded LoRA adapters.

The files are in the object store under the row's ``object_prefix``; the row is
written after the files (a listed adapter always has them) and removed before them.
A name is unique per organization (a unique constraint, so two concurrent uploads
of one name cannot both win).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from serve_app.contract.adapters import AdapterObjects
from serve_app.settings import get_settings
from serve_app.storage.db import Database
from serve_app.storage.objects import build_object_store
from serve_app.storage.schema import adapters

c = adapters.c


def new_adapter_id() -> str:
    return f"lora-{secrets.token_hex(12)}"


def object_prefix(adapter_id: str) -> str:
    """Where an adapter's files live in the object store."""
    return f"adapters/{adapter_id}"


@dataclass(frozen=True)
class AdapterRecord:
    """A row of ``adapters``."""

    id: str
    org_id: str
    user_id: str
    name: str
    base_model: str
    rank: int
    target_modules: str
    """Comma-separated module names."""
    bytes: int
    sha256: str
    object_prefix: str
    input_per_mtok: float | None
    output_per_mtok: float | None
    created_at: datetime

    def to_row(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _COLUMNS}

    @classmethod
    def from_row(cls, row: Any) -> AdapterRecord:
        return cls(**{name: row[name] for name in _COLUMNS})


_COLUMNS = tuple(col.name for col in adapters.columns)


class AdapterStore:
    """Reads and writes of ``adapters``; every read is scoped to one organization."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def insert(self, record: AdapterRecord) -> bool:
        """False when the organization already has an adapter of that name."""
        try:
            with self._db.begin() as conn:
                conn.execute(sa.insert(adapters).values(**record.to_row()))
        except IntegrityError:
            return False
        return True

    def insert_in(self, conn: Connection, record: AdapterRecord) -> bool:
        """``insert`` inside the caller's transaction (a savepoint, so a name taken
        concurrently leaves that transaction usable)."""
        try:
            with conn.begin_nested():
                conn.execute(sa.insert(adapters).values(**record.to_row()))
        except IntegrityError:
            return False
        return True

    def get(self, org_id: str, name: str) -> AdapterRecord | None:
        query = sa.select(adapters).where(c.org_id == org_id, c.name == name)
        with self._db.connect() as conn:
            row = conn.execute(query).mappings().first()
        return None if row is None else AdapterRecord.from_row(row)

    def list(self, org_id: str) -> list[AdapterRecord]:
        query = sa.select(adapters).where(c.org_id == org_id).order_by(c.created_at, c.id)
        with self._db.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [AdapterRecord.from_row(r) for r in rows]

    def count(self, org_id: str) -> int:
        query = sa.select(sa.func.count()).select_from(adapters).where(c.org_id == org_id)
        with self._db.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def delete(self, org_id: str, name: str) -> AdapterRecord | None:
        """Remove the org's adapter row; returns it (None when there was none)."""
        with self._db.begin() as conn:
            query = sa.select(adapters).where(c.org_id == org_id, c.name == name)
            row = conn.execute(query).mappings().first()
            if row is None:
                return None
            conn.execute(sa.delete(adapters).where(c.id == row["id"]))
        return AdapterRecord.from_row(row)


def open_head_objects() -> AdapterObjects:
    """The gateway's object store, opened in a chat head replica for uploaded adapters.

    The builder hands this function (not its result) to ``ChatHead``: the store comes
    from the same ``GATEWAY_*`` environment as the gateway's, and ``deployments`` never
    imports this package.
    """
    return build_object_store(get_settings())
