"""Per-organization quotas on stored objects: bytes and count (docs/api.md, "Tenant isolation").

Organizations share one object store (a local folder or an S3 bucket) and one
database; without a bound one organization could fill either for everyone. What an
organization holds is read from the rows that own the objects: its ``files`` (uploads
and batch outputs), its ``adapters`` and its video jobs' MP4s (``video_jobs`` rows with
a stored size), each counting as one object of its recorded size. Uploads are refused
past either bound with 403 ``storage_quota_exceeded`` (docs/reference/common.md#error-codes),
and so is a new video job while the organization is at a bound; a batch's output and an
accepted video job's file are written whatever the usage (the work was accepted) and
count against what comes next. Deleting a file, an adapter or a video job frees its share.

The check that admits an upload and the insert of its row are one transaction
serialised per organization (``BEGIN IMMEDIATE`` on SQLite; a transaction-scoped
advisory lock on the organization on PostgreSQL), so concurrent uploads of one
organization cannot all pass a check made before any of them was counted. A check
without the lock runs first, before the bytes are written, so an organization at its
bound does not have its upload stored only to be deleted again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from serve_app.protocol.errors import PermissionDeniedError
from serve_app.storage.db import Database
from serve_app.storage.schema import adapters, files, video_jobs

logger = logging.getLogger(__name__)

T = TypeVar("T")

_PG_ORG_LOCK_CLASS = 61_803_399
"""First key of the per-organization advisory lock (pg_advisory_xact_lock(int4, int4));
the video jobs' per-user lock uses 61_803_398."""

_OWNERS = (files, adapters, video_jobs)
"""The tables whose rows own stored objects, each with ``org_id`` and ``bytes``; a row
whose ``bytes`` is null (a video job without a stored file yet) owns nothing."""


@dataclass(frozen=True)
class StorageLimits:
    """An organization's bounds; ``None``: no bound."""

    max_bytes: int | None
    max_objects: int | None


@dataclass(frozen=True)
class StoredUsage:
    """What an organization holds: bytes and objects (files, batch outputs, adapters,
    videos)."""

    bytes: int
    objects: int


def storage_quota_exceeded(message: str, param: str | None = "file") -> PermissionDeniedError:
    """403: waiting frees nothing (only deleting does), so not a 429 the SDKs retry."""
    return PermissionDeniedError(message, code="storage_quota_exceeded", param=param)


class StorageQuotas:
    """Admits uploads within an organization's stored-bytes and object-count bounds."""

    def __init__(self, db: Database, limits: StorageLimits) -> None:
        self._db = db
        self.limits = limits

    def usage(self, org_id: str) -> StoredUsage:
        with self._db.connect() as conn:
            return _usage_in(conn, org_id)

    def check(self, org_id: str, adding_bytes: int) -> None:
        """Refuse an upload of ``adding_bytes`` that would pass a bound (no lock held)."""
        if self._bounded():
            self._refuse_past(self.usage(org_id), adding_bytes)

    def check_declared(self, org_id: str, at_least_bytes: int) -> None:
        """Refuse an upload whose body is not read yet, of at least ``at_least_bytes`` (its
        declared size less framing; 1 when none is declared), that would pass a bound."""
        if self._bounded():
            self._refuse_past(self.usage(org_id), at_least_bytes, declared=True)

    def check_new_video(self, org_id: str) -> None:
        """Refuse a new video job while the organization is at either bound: its file's
        size is known only once rendered (then stored whatever the usage), so the job is
        refused when one more object, or one more byte, would pass a bound. Blocking."""
        if not self._bounded():
            return
        usage = self.usage(org_id)
        max_objects, max_bytes = self.limits.max_objects, self.limits.max_bytes
        full_objects = max_objects is not None and usage.objects >= max_objects
        if full_objects or (max_bytes is not None and usage.bytes >= max_bytes):
            raise storage_quota_exceeded(
                f"Your organization stores {usage.objects} objects and {usage.bytes} bytes "
                "(files, batch outputs, adapters and videos), at its limit; delete some "
                "before generating another video.",
                param=None,
            )

    def store(
        self,
        org_id: str,
        adding_bytes: int,
        *,
        put: Callable[[], None],
        insert: Callable[[Connection], T],
        undo: Callable[[], None],
    ) -> T:
        """Check, ``put`` the bytes, then ``insert`` the row where the usage is checked
        again under the organization's lock; ``undo`` removes the bytes when the row
        is not written (refused, or the insert failed). Blocking: call in a thread."""
        self.check(org_id, adding_bytes)
        put()
        try:
            with self._db.begin() as conn:
                if self._bounded():
                    self._lock(conn, org_id)
                    self._refuse_past(_usage_in(conn, org_id), adding_bytes)
                return insert(conn)
        except BaseException:
            try:
                undo()
            except Exception:  # an orphaned object costs storage, not correctness
                logger.warning("stored bytes of a refused upload not removed", exc_info=True)
            raise

    def _bounded(self) -> bool:
        return self.limits.max_bytes is not None or self.limits.max_objects is not None

    def _lock(self, conn: Connection, org_id: str) -> None:
        """Queue this organization's admissions (SQLite: the write lock taken at BEGIN)."""
        if self._db.dialect == "postgresql":
            lock = sa.func.pg_advisory_xact_lock(
                sa.cast(sa.literal(_PG_ORG_LOCK_CLASS), sa.Integer), sa.func.hashtext(org_id)
            )
            conn.execute(sa.select(lock))

    def _refuse_past(self, usage: StoredUsage, adding_bytes: int, declared: bool = False) -> None:
        max_objects, max_bytes = self.limits.max_objects, self.limits.max_bytes
        if max_objects is not None and usage.objects + 1 > max_objects:
            raise storage_quota_exceeded(
                f"Your organization stores {usage.objects} objects (files, batch outputs, "
                f"adapters and videos), its limit; delete some to upload more."
            )
        if max_bytes is not None and usage.bytes + adding_bytes > max_bytes and declared:
            raise storage_quota_exceeded(
                f"Your organization stores {usage.bytes} bytes; this upload, of at least "
                f"{adding_bytes} bytes by its declared size, would pass its limit of "
                f"{max_bytes}; delete files, adapters or videos to make room."
            )
        if max_bytes is not None and usage.bytes + adding_bytes > max_bytes:
            raise storage_quota_exceeded(
                f"This upload of {adding_bytes} bytes would take your organization's stored "
                f"bytes to {usage.bytes + adding_bytes}, over its limit of {max_bytes}; delete "
                "files, adapters or videos to make room."
            )


def _usage_in(conn: Connection, org_id: str) -> StoredUsage:
    total_bytes = total_objects = 0
    for table in _OWNERS:
        size, count = conn.execute(
            # count(bytes), not count(*): a video job without a stored file owns nothing.
            sa.select(sa.func.coalesce(sa.func.sum(table.c.bytes), 0), sa.func.count(table.c.bytes))
            .select_from(table)
            .where(table.c.org_id == org_id)
        ).one()
        total_bytes += int(size)
        total_objects += int(count)
    return StoredUsage(total_bytes, total_objects)
