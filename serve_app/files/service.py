"""``/v1/files`` (docs/api.md, "Files"): upload, list, read, download, delete.

A file belongs to the organization of the key that uploaded it (or, for a batch's
output, of the batch's owner): every read is scoped to the caller's organization,
and another organization's id answers exactly like a missing one (404). Bytes go
to the object store (a local folder, or S3), rows to SQL; blocking calls of both
run in threads, off the replica's event loop. No file is ever whole in memory: an
upload goes from its spooled temporary file to the store in chunks (``put_file``),
and a download is streamed from the store chunk by chunk (``iter_chunks``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from serve_app.auth.principal import Principal
from serve_app.files.store import FileRecord, FileStore, new_file_id, object_key
from serve_app.inference.answers import FrameStream
from serve_app.protocol.errors import InvalidRequestError, NotFoundError, RequestTooLargeError
from serve_app.protocol.files import UPLOAD_PURPOSES, FileDeleted, FileList, FileObject
from serve_app.protocol.uploads import Upload, spooled_size
from serve_app.storage.objects import ObjectChunks, ObjectStore
from serve_app.storage.quotas import StorageQuotas
from serve_app.storage.schema import utcnow

MAX_FILENAME_CHARS = 255
MAX_LIST_LIMIT = 10_000
JSONL = "application/jsonl"


def file_not_found(file_id: str) -> NotFoundError:
    """The 404 of a missing file and of another organization's file alike."""
    shown = file_id if len(file_id) <= 64 else f"{file_id[:64]}..."
    return NotFoundError(f"No such File object: {shown}", code="file_not_found", param="file_id")


def file_object(record: FileRecord) -> FileObject:
    return FileObject(
        id=record.id,
        bytes=record.bytes,
        created_at=int(record.created_at.timestamp()),
        filename=record.filename,
        purpose="batch_output" if record.purpose == "batch_output" else "batch",
    )


@dataclass(frozen=True)
class FilePolicy:
    max_file_bytes: int
    list_limit: int


class FileService:
    """The files of every organization, in SQL and the object store."""

    def __init__(
        self, store: FileStore, objects: ObjectStore, policy: FilePolicy, *, quotas: StorageQuotas
    ) -> None:
        self.store = store
        self.objects = objects
        self.policy = policy
        self.quotas = quotas

    async def upload(self, upload: Upload, purpose: str, principal: Principal) -> FileObject:
        if purpose not in UPLOAD_PURPOSES:
            raise InvalidRequestError(
                f"Invalid value for 'purpose': '{purpose[:64]}'; supported: "
                f"{', '.join(UPLOAD_PURPOSES)}.",
                code="invalid_value",
                param="purpose",
            )
        size = await asyncio.to_thread(spooled_size, upload)
        if size > self.policy.max_file_bytes:
            raise RequestTooLargeError(
                f"The file is larger than {self.policy.max_file_bytes} bytes.", param="file"
            )
        name = (upload.filename or "upload.jsonl")[:MAX_FILENAME_CHARS]
        record = FileRecord(
            id=new_file_id(),
            org_id=principal.org_id,
            user_id=principal.user_id,
            purpose=purpose,
            filename=name,
            bytes=size,
            object_key="",
            created_at=utcnow(),
        )
        record = FileRecord(**{**record.to_row(), "object_key": object_key(record.id)})
        await asyncio.to_thread(
            self.quotas.store,  # the organization's stored bytes and files are bounded
            principal.org_id,
            record.bytes,
            put=lambda: self.objects.put_file(record.object_key, upload.file, JSONL),
            insert=lambda conn: self.store.insert_in(conn, record),
            undo=lambda: self.objects.delete(record.object_key),
        )
        return file_object(record)

    async def get(self, file_id: str, principal: Principal) -> FileObject:
        return file_object(await self.record(file_id, principal.org_id))

    async def record(self, file_id: str, org_id: str) -> FileRecord:
        record = await asyncio.to_thread(self.store.get, file_id, org_id)
        if record is None:
            raise file_not_found(file_id)
        return record

    async def content(self, file_id: str, principal: Principal) -> FrameStream:
        """The file's bytes streamed from the store (a batch's output may be gigabytes);
        a missing object is the 404 before the first byte."""
        record = await self.record(file_id, principal.org_id)
        chunks = await asyncio.to_thread(self.objects.iter_chunks, record.object_key)
        headers = {} if chunks.length is None else {"content-length": str(chunks.length)}
        return FrameStream(
            _relay(chunks),
            lambda: asyncio.to_thread(chunks.close),
            headers=headers,
            media_type=JSONL,
        )

    async def list(
        self,
        principal: Principal,
        *,
        limit: int | None,
        after: str | None,
        purpose: str | None,
        order: str,
    ) -> FileList:
        if order not in ("asc", "desc"):
            raise InvalidRequestError(
                "Invalid value for 'order': expected 'asc' or 'desc'.",
                code="invalid_value",
                param="order",
            )
        size = self.policy.list_limit if limit is None else limit
        if not 1 <= size <= MAX_LIST_LIMIT:
            raise InvalidRequestError(
                f"Invalid value for 'limit': expected 1..{MAX_LIST_LIMIT}.",
                code="invalid_value",
                param="limit",
            )
        records, more = await asyncio.to_thread(
            lambda: self.store.page(
                principal.org_id,
                limit=size,
                after=after,
                purpose=purpose,
                newest_first=order == "desc",
            )
        )
        data = [file_object(r) for r in records]
        return FileList(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=more,
        )

    async def delete(self, file_id: str, principal: Principal) -> FileDeleted:
        record = await asyncio.to_thread(self.store.delete, file_id, principal.org_id)
        if record is None:
            raise file_not_found(file_id)
        await asyncio.to_thread(self.objects.delete, record.object_key)
        return FileDeleted(id=record.id)


async def _relay(chunks: ObjectChunks) -> AsyncIterator[bytes]:
    """The object's chunks, each read in a thread; closed however the response ends."""
    try:
        while chunk := await asyncio.to_thread(next, chunks, b""):
            yield chunk
    finally:
        await asyncio.to_thread(chunks.close)
