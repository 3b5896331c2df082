"""``/v1/files`` never holds a whole file: an upload goes from its spooled temporary file
to the object store in chunks, and a download is streamed from the store chunk by chunk
(Python's peak allocation stays near one chunk for a 48 MiB file); over HTTP a download
larger than a chunk arrives whole, with its length."""

from __future__ import annotations

import tempfile
import tracemalloc
from pathlib import Path
from typing import BinaryIO

import pytest

from serve_app.auth.principal import Principal
from serve_app.files.service import FilePolicy, FileService
from serve_app.files.store import FileStore
from serve_app.inference.answers import FrameStream
from serve_app.protocol.errors import NotFoundError, RequestTooLargeError
from serve_app.storage.db import Database
from serve_app.storage.objects import LocalObjectStore
from serve_app.storage.quotas import StorageLimits, StorageQuotas
from tests.unit.batches.conftest import BatchHarness

ALICE = Principal("key-a", "user-a", "org-a", "member", frozenset({"inference"}))
MIB = 1 << 20


class _SpooledUpload:
    """An upload as the route hands it: a spooled temporary file. ``read`` is refused, so
    the service can only have streamed it."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.filename = "big.jsonl"
        self.size = None

    async def seek(self, offset: int) -> None:
        self.file.seek(offset)

    async def read(self, size: int = -1) -> bytes:
        raise AssertionError("the upload was read into memory")


def _spooled(size: int) -> BinaryIO:
    spool = tempfile.SpooledTemporaryFile(max_size=MIB)  # noqa: SIM115 (the caller owns it)
    line = b'{"custom_id": "x", "body": {}}\n'
    for _ in range(size // len(line)):
        spool.write(line)
    spool.write(b"\n" * (size % len(line)))
    return spool  # type: ignore[return-value]


@pytest.fixture
def service(db: Database, tmp_path: Path) -> FileService:
    objects = LocalObjectStore(tmp_path / "objects", secret=b"s")
    return FileService(
        FileStore(db),
        objects,
        FilePolicy(max_file_bytes=64 * MIB, list_limit=20),
        quotas=StorageQuotas(db, StorageLimits(None, None)),
    )


async def test_an_upload_and_its_download_are_streamed(service: FileService) -> None:
    size = 48 * MIB
    upload = _SpooledUpload(_spooled(size))
    tracemalloc.start()
    try:
        made = await service.upload(upload, "batch", ALICE)
        upload_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        answer = await service.content(made.id, ALICE)
        assert isinstance(answer, FrameStream)
        received = 0
        async for chunk in answer.frames:
            received += len(chunk)
        download_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert made.bytes == size == received
    assert answer.headers["content-length"] == str(size)
    assert answer.media_type == "application/jsonl"
    assert upload_peak < 8 * MIB, upload_peak
    assert download_peak < 8 * MIB, download_peak


async def test_an_upload_over_the_limit_stores_nothing(db: Database, tmp_path: Path) -> None:
    objects = LocalObjectStore(tmp_path / "objects", secret=b"s")
    service = FileService(
        FileStore(db),
        objects,
        FilePolicy(max_file_bytes=MIB, list_limit=20),
        quotas=StorageQuotas(db, StorageLimits(None, None)),
    )
    with pytest.raises(RequestTooLargeError):
        await service.upload(_SpooledUpload(_spooled(MIB + 1)), "batch", ALICE)
    assert not (tmp_path / "objects").exists()
    listed = await service.list(ALICE, limit=None, after=None, purpose=None, order="desc")
    assert listed.data == []


async def test_a_download_whose_bytes_are_gone_is_a_404_before_any_byte(
    service: FileService,
) -> None:
    made = await service.upload(_SpooledUpload(_spooled(100)), "batch", ALICE)
    record = await service.record(made.id, ALICE.org_id)
    service.objects.delete(record.object_key)
    with pytest.raises(NotFoundError):
        await service.content(made.id, ALICE)


async def test_a_closed_download_lets_go_of_the_object(service: FileService) -> None:
    made = await service.upload(_SpooledUpload(_spooled(3 * MIB)), "batch", ALICE)
    answer = await service.content(made.id, ALICE)
    assert isinstance(answer, FrameStream)
    await answer.release()  # the client left before the first byte
    assert [chunk async for chunk in answer.frames] == []


async def test_a_download_larger_than_a_chunk_over_http(batches: BatchHarness) -> None:
    content = b"".join(b'{"i": %d}\n' % i for i in range(300_000))  # ~3.3 MiB
    assert len(content) > 3 * MIB
    async with batches.client() as http:
        made = await http.post(
            "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
        )
        assert made.status_code == 200 and made.json()["bytes"] == len(content)
        answer = await http.get(f"/v1/files/{made.json()['id']}/content")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("application/jsonl")
    assert answer.headers["content-length"] == str(len(content))
    assert answer.content == content
