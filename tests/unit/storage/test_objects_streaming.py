"""Object stores streamed both ways: ``put_file`` copies a file object in chunks,
``iter_chunks`` reads an object back in chunks, ``size`` answers without reading; on
the local store (objects 0600) and on S3 through boto3 against moto's S3 server (a
multipart upload for a file larger than boto3's 8 MiB threshold)."""

from __future__ import annotations

import io
import os
import socket
import stat
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer

from serve_app.protocol.errors import NotFoundError
from serve_app.storage.objects import LocalObjectStore, ObjectStore, S3ObjectStore

KEY = "files/file-0123456789abcdef01234567"
BUCKET = "stream-test"


class _Generated(io.RawIOBase):
    """A file object of ``size`` bytes made on demand: nothing ever holds them all."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = b"z" * n
        self.left -= n
        return n


def _roundtrip(store: ObjectStore, payload: bytes, chunk: int) -> list[bytes]:
    store.put_file(KEY, io.BytesIO(payload), "application/jsonl")
    assert store.size(KEY) == len(payload)
    chunks = list(store.iter_chunks(KEY, chunk))
    assert b"".join(chunks) == payload
    return chunks


# ---------------------------------------------------------------------------- local


def test_local_put_file_and_iter_chunks_round_trip(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects", secret=b"s")
    payload = os.urandom(3 * 1024 + 17)
    chunks = _roundtrip(store, payload, 1024)
    assert [len(c) for c in chunks] == [1024, 1024, 1024, 17]
    assert store.get(KEY) == payload


def test_local_put_file_copies_from_the_current_position(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path, secret=b"s")
    source = io.BytesIO(b"header|body")
    source.seek(7)
    store.put_file(KEY, source, "application/jsonl")
    assert store.get(KEY) == b"body"


def test_local_objects_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path, secret=b"s")
    store.put("videos/a.mp4", b"video", "video/mp4")
    store.put_file(KEY, io.BytesIO(b"{}\n"), "application/jsonl")
    for key in ("videos/a.mp4", KEY):
        assert stat.S_IMODE((tmp_path / key).stat().st_mode) == 0o600


def test_local_put_file_streams_without_holding_the_file(tmp_path: Path) -> None:
    """64 MiB through ``put_file`` and back through ``iter_chunks``: Python's peak stays
    near one chunk, far below the object."""
    store = LocalObjectStore(tmp_path, secret=b"s")
    size = 64 << 20
    tracemalloc.start()
    try:
        store.put_file(KEY, io.BufferedReader(_Generated(size)), "application/jsonl")
        total = sum(len(chunk) for chunk in store.iter_chunks(KEY))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == size == store.size(KEY)
    assert peak < 8 << 20, peak


def test_local_failed_copy_leaves_neither_object_nor_temporary_file(tmp_path: Path) -> None:
    class Broken(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            raise OSError("client went away")

    store = LocalObjectStore(tmp_path, secret=b"s")
    with pytest.raises(OSError, match="went away"):
        store.put_file(KEY, io.BufferedReader(Broken()), "application/jsonl")
    assert list((tmp_path / "files").iterdir()) == []


def test_local_missing_objects_are_not_found_before_the_first_chunk(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path, secret=b"s")
    with pytest.raises(NotFoundError):
        store.iter_chunks(KEY)
    with pytest.raises(NotFoundError):
        store.size(KEY)
    with pytest.raises(ValueError):
        store.put_file("../escape", io.BytesIO(b"x"), "application/jsonl")


def test_local_chunks_closed_early_let_go_of_the_file(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path, secret=b"s")
    store.put(KEY, b"x" * 10, "application/jsonl")
    chunks = store.iter_chunks(KEY, 4)
    assert next(chunks) == b"xxxx"
    chunks.close()
    assert list(chunks) == []
    chunks.close()  # idempotent


# ---------------------------------------------------------------------------- S3 (moto server)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_client() -> Iterator[Any]:
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(s3={"addressing_style": "path"}),
        )
        client.create_bucket(Bucket=BUCKET)
        yield client
    finally:
        server.stop()


def test_s3_put_file_and_iter_chunks_round_trip(s3_client: Any) -> None:
    store = S3ObjectStore(s3_client, BUCKET, "gw/")
    payload = os.urandom(5000)
    chunks = _roundtrip(store, payload, 2048)
    assert [len(c) for c in chunks] == [2048, 2048, 904]
    head = s3_client.head_object(Bucket=BUCKET, Key=f"gw/{KEY}")
    assert head["ContentType"] == "application/jsonl"


def test_s3_large_put_file_is_a_multipart_upload(s3_client: Any) -> None:
    store = S3ObjectStore(s3_client, BUCKET, "gw/")
    payload = os.urandom(9 << 20)  # past boto3's 8 MiB multipart threshold
    _roundtrip(store, payload, 1 << 20)
    head = s3_client.head_object(Bucket=BUCKET, Key=f"gw/{KEY}")
    assert head["ETag"].strip('"').endswith("-2")  # a multipart object's ETag: 2 parts


def test_s3_missing_objects_are_not_found(s3_client: Any) -> None:
    store = S3ObjectStore(s3_client, BUCKET, "gw/")
    with pytest.raises(NotFoundError):
        store.iter_chunks("files/missing")
    with pytest.raises(NotFoundError):
        store.size("files/missing")


def test_s3_chunks_closed_early_release_the_body(s3_client: Any) -> None:
    store = S3ObjectStore(s3_client, BUCKET, "gw/")
    store.put(KEY, b"y" * 4096, "application/jsonl")
    chunks = store.iter_chunks(KEY, 1024)
    assert next(chunks) == b"y" * 1024
    chunks.close()
    assert list(chunks) == []


def test_s3_put_file_bounds_the_parts_in_flight() -> None:
    """boto3 reads ahead one part per upload thread (10 by default: 80 MiB held); the store
    asks for ``S3_PART_UPLOADS``."""
    from serve_app.storage.objects import S3_PART_UPLOADS

    seen: dict[str, Any] = {}

    class Client:
        def upload_fileobj(self, fileobj: Any, bucket: str, key: str, **kwargs: Any) -> None:
            seen.update(kwargs, body=fileobj.read(), bucket=bucket, key=key)

    S3ObjectStore(Client(), BUCKET, "gw/").put_file(KEY, io.BytesIO(b"abc"), "application/jsonl")
    assert seen["Config"].max_concurrency == S3_PART_UPLOADS <= 4
    assert (seen["body"], seen["key"], seen["ExtraArgs"]) == (
        b"abc",
        f"gw/{KEY}",
        {"ContentType": "application/jsonl"},
    )
