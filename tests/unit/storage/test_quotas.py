"""Per-organization stored bytes and object count (serve_app/storage/quotas.py), on SQLite
and PostgreSQL: what counts, the refusal, and concurrent uploads of one organization."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from serve_app.adapters.store import AdapterRecord, AdapterStore
from serve_app.files.store import FileRecord, FileStore
from serve_app.protocol.errors import PermissionDeniedError
from serve_app.storage.db import Database
from serve_app.storage.quotas import StorageLimits, StorageQuotas, StoredUsage
from serve_app.storage.schema import utcnow

_ids = iter(range(1_000_000))


def file_record(org_id: str, size: int, purpose: str = "batch") -> FileRecord:
    file_id = f"file-{next(_ids)}"
    return FileRecord(
        id=file_id,
        org_id=org_id,
        user_id="u",
        purpose=purpose,
        filename="a.jsonl",
        bytes=size,
        object_key=f"files/{file_id}",
        created_at=utcnow(),
    )


def adapter_record(org_id: str, size: int) -> AdapterRecord:
    adapter_id = f"lora-{next(_ids)}"
    return AdapterRecord(
        id=adapter_id,
        org_id=org_id,
        user_id="u",
        name=adapter_id,
        base_model="base",
        rank=4,
        target_modules="q_proj",
        bytes=size,
        sha256="0" * 64,
        object_prefix=f"adapters/{adapter_id}",
        input_per_mtok=None,
        output_per_mtok=None,
        created_at=utcnow(),
    )


class Objects:
    """What ``put``/``undo`` did, by key."""

    def __init__(self) -> None:
        self.stored: set[str] = set()
        self.lock = threading.Lock()

    def put(self, key: str) -> None:
        with self.lock:
            self.stored.add(key)

    def undo(self, key: str) -> None:
        with self.lock:
            self.stored.discard(key)


def upload(quotas: StorageQuotas, db: Database, objects: Objects, record: FileRecord) -> None:
    quotas.store(
        record.org_id,
        record.bytes,
        put=lambda: objects.put(record.object_key),
        insert=lambda conn: FileStore(db).insert_in(conn, record),
        undo=lambda: objects.undo(record.object_key),
    )


def refused(call: Any) -> PermissionDeniedError:
    with pytest.raises(PermissionDeniedError) as caught:
        call()
    assert caught.value.code == "storage_quota_exceeded"
    assert caught.value.status_code == 403
    return caught.value


def test_usage_counts_an_organizations_files_batch_outputs_and_adapters(db: Database) -> None:
    files, adapters = FileStore(db), AdapterStore(db)
    files.insert(file_record("acme", 100))
    files.insert(file_record("acme", 20, purpose="batch_output"))
    assert adapters.insert(adapter_record("acme", 3))
    files.insert(file_record("other", 5000))
    assert adapters.insert(adapter_record("other", 7))
    quotas = StorageQuotas(db, StorageLimits(None, None))
    assert quotas.usage("acme") == StoredUsage(bytes=123, objects=3)
    assert quotas.usage("nobody") == StoredUsage(bytes=0, objects=0)


def test_the_object_bound_refuses_before_anything_is_stored(db: Database) -> None:
    quotas, objects = StorageQuotas(db, StorageLimits(None, 2)), Objects()
    FileStore(db).insert(file_record("other", 1))  # another organization's: not counted
    for _ in range(2):
        upload(quotas, db, objects, file_record("acme", 1))
    third = file_record("acme", 1)
    err = refused(lambda: upload(quotas, db, objects, third))
    assert "2 objects" in err.message
    assert third.object_key not in objects.stored and len(objects.stored) == 2
    assert quotas.usage("acme").objects == 2


def test_the_byte_bound_counts_the_upload_itself(db: Database) -> None:
    quotas, objects = StorageQuotas(db, StorageLimits(100, None)), Objects()
    upload(quotas, db, objects, file_record("acme", 60))
    refused(lambda: upload(quotas, db, objects, file_record("acme", 41)))
    upload(quotas, db, objects, file_record("acme", 40))  # exactly the bound
    assert quotas.usage("acme") == StoredUsage(bytes=100, objects=2)


def test_a_refusal_under_the_lock_removes_the_bytes_it_had_stored(db: Database) -> None:
    """Another upload of the organization lands between the first check and the row."""
    quotas, objects = StorageQuotas(db, StorageLimits(None, 1)), Objects()
    late = file_record("acme", 1)

    def put_while_another_lands() -> None:
        objects.put(late.object_key)
        FileStore(db).insert(file_record("acme", 1))

    refused(
        lambda: quotas.store(
            "acme",
            1,
            put=put_while_another_lands,
            insert=lambda conn: FileStore(db).insert_in(conn, late),
            undo=lambda: objects.undo(late.object_key),
        )
    )
    assert late.object_key not in objects.stored
    assert quotas.usage("acme").objects == 1


def test_concurrent_uploads_of_one_organization_cannot_pass_the_bound(db: Database) -> None:
    """Every upload passes the unlocked check first (they all wait together in ``put``);
    the check under the organization's lock admits exactly the bound."""
    bound, uploads = 3, 8
    quotas, objects = StorageQuotas(db, StorageLimits(None, bound)), Objects()
    together = threading.Barrier(uploads, timeout=30)

    def one(_: int) -> bool:
        record = file_record("acme", 1)
        try:
            quotas.store(
                "acme",
                1,
                put=lambda: (objects.put(record.object_key), together.wait()),  # type: ignore[func-returns-value]
                insert=lambda conn: FileStore(db).insert_in(conn, record),
                undo=lambda: objects.undo(record.object_key),
            )
        except PermissionDeniedError:
            return False
        return True

    with ThreadPoolExecutor(uploads) as pool:
        admitted = list(pool.map(one, range(uploads)))
    assert sum(admitted) == bound
    assert quotas.usage("acme").objects == bound
    assert len(objects.stored) == bound  # the refused uploads' bytes were removed


def test_without_bounds_nothing_is_refused(db: Database) -> None:
    quotas, objects = StorageQuotas(db, StorageLimits(None, None)), Objects()
    for _ in range(3):
        upload(quotas, db, objects, file_record("acme", 10**12))
    assert quotas.usage("acme") == StoredUsage(bytes=3 * 10**12, objects=3)
