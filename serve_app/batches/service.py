"""``/v1/batches`` (docs/api.md, "Batches"): create, retrieve, list, cancel.

The API side only writes rows: ``create`` checks the request and the input file
and inserts the batch as ``validating``; the workers (``serve_app.batches.worker``)
validate it, run its lines and finalize it. Nothing here bills: retrieving, listing
and cancelling read or flip a row. Batches belong to the organization of the key
that created them; another organization's id is a 404 like a missing one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime, timedelta

from serve_app.auth.principal import Principal
from serve_app.batches.records import (
    CANCELLING,
    FINALIZING,
    IN_PROGRESS,
    VALIDATING,
    BatchRecord,
    new_batch_id,
)
from serve_app.batches.store import BatchStore
from serve_app.config import BatchOptions
from serve_app.files.store import FileStore
from serve_app.protocol.batches import (
    MAX_METADATA_KEY,
    Batch,
    BatchCreateRequest,
    BatchErrors,
    BatchList,
    BatchRequestCounts,
)
from serve_app.protocol.errors import ConflictError, InvalidRequestError, NotFoundError
from serve_app.storage.schema import utcnow

MAX_LIST_LIMIT = 100


def batch_not_found(batch_id: str) -> NotFoundError:
    shown = batch_id if len(batch_id) <= 64 else f"{batch_id[:64]}..."
    return NotFoundError(f"No batch found with id '{shown}'.", code="batch_not_found", param="id")


def _ts(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


class BatchService:
    """Batches of every organization; ``wake`` pokes this replica's worker."""

    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        options: BatchOptions,
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.files = files
        self.options = options
        self.clock = clock
        self.wake: Callable[[], None] = lambda: None
        """Set by the worker of this replica: a new batch is validated at once."""

    async def create(self, body: BatchCreateRequest, principal: Principal) -> Batch:
        _check_request(body)
        source = await asyncio.to_thread(self.files.get, body.input_file_id, principal.org_id)
        if source is None:
            raise NotFoundError(
                f"No such File object: {body.input_file_id[:64]}",
                code="file_not_found",
                param="input_file_id",
            )
        if source.purpose != "batch":
            raise InvalidRequestError(
                f"The file '{source.id}' has purpose '{source.purpose}'; a batch's input file "
                "must be uploaded with purpose 'batch'.",
                code="invalid_value",
                param="input_file_id",
            )
        now = self.clock()
        record = BatchRecord(
            id=new_batch_id(),
            org_id=principal.org_id,
            user_id=principal.user_id,
            key_id=principal.key_id,
            endpoint=body.endpoint,
            input_file_id=source.id,
            completion_window=body.completion_window,
            meta=None if body.metadata is None else json.dumps(body.metadata),
            status=VALIDATING,
            output_file_id=None,
            error_file_id=None,
            errors=None,
            total=0,
            completed=0,
            failed=0,
            estimated_tokens=0,
            lease_owner=None,
            lease_expires_at=None,
            created_at=now,
            expires_at=now + timedelta(seconds=self.options.completion_window_s),
        )
        await asyncio.to_thread(self.store.create, record)
        self.wake()
        return await self.view(record)

    async def get(self, batch_id: str, principal: Principal) -> Batch:
        record = await asyncio.to_thread(self.store.get, batch_id, principal.org_id)
        if record is None:
            raise batch_not_found(batch_id)
        return await self.view(record)

    async def list(self, principal: Principal, *, limit: int, after: str | None) -> BatchList:
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidRequestError(
                f"Invalid value for 'limit': expected 1..{MAX_LIST_LIMIT}.",
                code="invalid_value",
                param="limit",
            )
        records, more = await asyncio.to_thread(self.store.page, principal.org_id, limit, after)
        data = [await self.view(r) for r in records]
        return BatchList(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=more,
        )

    async def cancel(self, batch_id: str, principal: Principal) -> Batch:
        """Stop claiming new lines; finished ones are kept (the worker finalizes)."""
        now = self.clock()
        record = await asyncio.to_thread(self.store.cancel, batch_id, principal.org_id, now)
        if record is None:
            raise batch_not_found(batch_id)
        if record.status not in (CANCELLING, "cancelled"):
            raise ConflictError(
                f"Cannot cancel a batch with status '{record.status}'.",
                code="batch_not_cancellable",
                param="id",
            )
        self.wake()
        return await self.view(record)

    async def view(self, record: BatchRecord) -> Batch:
        """The Batch object; a running batch's counts are read from its lines."""
        completed, failed = record.completed, record.failed
        if record.status in (IN_PROGRESS, FINALIZING, CANCELLING) and record.total:
            completed, failed = await asyncio.to_thread(self.store.line_counts, record.id)
        errors = None
        if record.errors is not None:
            errors = BatchErrors.model_validate({"data": json.loads(record.errors)})
        return Batch(
            id=record.id,
            endpoint=record.endpoint,
            errors=errors,
            input_file_id=record.input_file_id,
            completion_window=record.completion_window,
            status=record.status,  # type: ignore[arg-type]  # the table's check holds it
            output_file_id=record.output_file_id,
            error_file_id=record.error_file_id,
            created_at=int(record.created_at.timestamp()),
            in_progress_at=_ts(record.in_progress_at),
            expires_at=_ts(record.expires_at),
            finalizing_at=_ts(record.finalizing_at),
            completed_at=_ts(record.completed_at),
            failed_at=_ts(record.failed_at),
            expired_at=_ts(record.expired_at),
            cancelling_at=_ts(record.cancelling_at),
            cancelled_at=_ts(record.cancelled_at),
            request_counts=BatchRequestCounts(
                total=record.total, completed=completed, failed=failed
            ),
            metadata=record.metadata(),
        )


def _check_request(body: BatchCreateRequest) -> None:
    for key in body.metadata or {}:
        if len(key) > MAX_METADATA_KEY:
            raise InvalidRequestError(
                f"Metadata keys are at most {MAX_METADATA_KEY} characters.",
                code="invalid_value",
                param="metadata",
            )
