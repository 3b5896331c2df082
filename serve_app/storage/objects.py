"""Object storage for files (videos, batch files): a local folder, or S3 through boto3.

Both stores answer the same calls: ``put`` (the video head uploads a finished
MP4), ``put_file`` (the same from a file object, read in chunks: ``/v1/files`` an
upload, a batch its output, neither ever whole in memory), ``get`` (a batch's
input), ``iter_chunks`` and ``size`` (a file's content, streamed), ``delete`` (an
upload orphaned by a cancellation, a deleted file), and ``url`` (the gateway
resolves a fresh, expiring URL on every read of a job).

- ``LocalObjectStore`` (the embedded default) needs no server: files live under
  ``<state_dir>/objects`` and the gateway serves them itself at
  ``GET /v1/video/files/{key}?expires=..&signature=..``. The URL is its own
  credential (no API key, like an S3 presigned URL): an HMAC-SHA256 of the key
  and the expiry under a secret only the gateway's processes know. Keys are
  checked against a strict pattern before any path is built, so no request can
  name a file outside the folder. One machine only: heads and gateway replicas
  must share the folder. Objects are written 0600: readable by the gateway's own
  user only.
- ``S3ObjectStore`` puts objects in a bucket of any S3-compatible service and
  hands out boto3 presigned GET URLs (computed locally, no request to S3).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import quote

from serve_app.protocol.errors import NotFoundError, PermissionDeniedError
from serve_app.settings import GatewaySettings

logger = logging.getLogger(__name__)

FILES_ROUTE = "/v1/video/files/"
"""Where the gateway serves the local store's objects (serve_app.routes.video)."""

_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_KEY = re.compile(rf"^{_SEGMENT}(?:/{_SEGMENT}){{0,7}}$")
"""Segments start with a letter or digit: no ``.``/``..``, no hidden files, no empty parts."""
_SECRET_FILE = ".url-secret"
CHUNK_BYTES = 1 << 20
"""How much of an object one read or copy step holds."""
S3_PART_UPLOADS = 4
"""Parts of one S3 multipart upload sent at once (8 MiB each)."""


def valid_key(key: str) -> bool:
    return len(key) <= 512 and _KEY.fullmatch(key) is not None


class ObjectStore(Protocol):
    """Where generated files go and how a client is given a URL to fetch them."""

    def put(self, key: str, data: bytes, content_type: str) -> None: ...

    def put_file(self, key: str, fileobj: BinaryIO, content_type: str) -> None:
        """Store what ``fileobj`` holds from its position to its end, read in chunks."""
        ...

    def get(self, key: str) -> bytes:
        """The object's bytes; ``NotFoundError`` when it does not exist."""
        ...

    def iter_chunks(self, key: str, chunk_size: int = CHUNK_BYTES) -> ObjectChunks:
        """The object's bytes in chunks of at most ``chunk_size``; ``NotFoundError`` at
        once (not at the first chunk) when it does not exist."""
        ...

    def size(self, key: str) -> int:
        """The object's size in bytes; ``NotFoundError`` when it does not exist."""
        ...

    def delete(self, key: str) -> None: ...

    def url(self, key: str, expires_in_s: int, base_url: str) -> str: ...


def _object_not_found() -> NotFoundError:
    return NotFoundError("No such file.", code="object_not_found")


class ObjectChunks(Iterator[bytes]):
    """An open object read chunk by chunk; ``close`` lets go of it (a file handle, an
    HTTP connection) even when it was not read to its end, and reading to the end
    closes it too."""

    def __init__(
        self,
        read: Callable[[int], bytes],
        close: Callable[[], None],
        size: int,
        length: int | None = None,
    ) -> None:
        self._read, self._close, self._size = read, close, size
        self._closed = False
        self.length = length
        """The object's size as opened (None when the store did not say)."""

    def __iter__(self) -> ObjectChunks:
        return self

    def __next__(self) -> bytes:
        if self._closed:
            raise StopIteration
        chunk = self._read(self._size)
        if not chunk:
            self.close()
            raise StopIteration
        return chunk

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()


class LocalObjectStore:
    """Files in a local folder, served by the gateway under HMAC-signed expiring URLs."""

    def __init__(
        self,
        root: Path,
        secret: bytes | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self._secret = secret
        self._clock = clock

    # ---- writing (the video head, files, batch outputs) ----------------------------
    def put(self, key: str, data: bytes, content_type: str) -> None:
        """Write atomically: a reader never sees a half-written file."""
        self._write(key, lambda handle: handle.write(data))

    def put_file(self, key: str, fileobj: BinaryIO, content_type: str) -> None:
        """Copy in chunks into a temporary file beside the object, then rename it."""
        self._write(key, lambda handle: shutil.copyfileobj(fileobj, handle, CHUNK_BYTES))

    def _write(self, key: str, fill: Callable[[BinaryIO], object]) -> None:
        """A temporary file (``mkstemp``: mode 0600, the gateway's user only: other local
        users must not read another organization's files), filled, renamed into place."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".upload-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                fill(handle)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise _object_not_found() from None

    def iter_chunks(self, key: str, chunk_size: int = CHUNK_BYTES) -> ObjectChunks:
        try:
            handle = self._path(key).open("rb")
        except FileNotFoundError:
            raise _object_not_found() from None
        length = os.fstat(handle.fileno()).st_size
        return ObjectChunks(handle.read, handle.close, chunk_size, length)

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise _object_not_found() from None

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    # ---- signing and serving (the gateway) -----------------------------------------
    def url(self, key: str, expires_in_s: int, base_url: str) -> str:
        expires = int(self._clock()) + expires_in_s
        signature = self.signature(key, expires)
        base = base_url.rstrip("/")
        return f"{base}{FILES_ROUTE}{quote(key)}?expires={expires}&signature={signature}"

    def signature(self, key: str, expires: int) -> str:
        message = f"{key}\n{expires}".encode()
        return hmac.new(self._key(), message, hashlib.sha256).hexdigest()

    def verified_path(self, key: str, expires: str, signature: str) -> Path:
        """The file a signed URL names, or 404 (bad key, missing file) / 403 (bad or expired).

        The key's shape is checked first, so nothing outside the folder is ever
        looked at; the signature is compared in constant time.
        """
        if not valid_key(key):
            raise _object_not_found()
        if not expires.isdigit() or len(expires) > 12:
            raise PermissionDeniedError("Invalid URL signature.", code="invalid_signature")
        if not hmac.compare_digest(self.signature(key, int(expires)), signature):
            raise PermissionDeniedError("Invalid URL signature.", code="invalid_signature")
        if int(expires) < self._clock():
            raise PermissionDeniedError(
                "This URL has expired; read the job again for a fresh one.", code="url_expired"
            )
        path = self._path(key)
        if not path.is_file():
            raise _object_not_found()
        return path

    def _path(self, key: str) -> Path:
        if not valid_key(key):
            raise ValueError(f"invalid object key {key!r}")
        return self.root / key

    def _key(self) -> bytes:
        """The signing secret: configured, or generated once per folder and shared."""
        if self._secret is None:
            self._secret = _shared_secret(self.root / _SECRET_FILE)
        return self._secret


def _shared_secret(path: Path) -> bytes:
    """Read the folder's secret, creating it atomically (link) if no process has yet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        fd, tmp = tempfile.mkstemp(prefix=".secret-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32))
            try:
                os.link(tmp, path)  # fails if another process created it first
                logger.info("generated the object URL signing secret in %s", path)
            except FileExistsError:
                pass
        finally:
            Path(tmp).unlink(missing_ok=True)
    return path.read_text().strip().encode()


class S3ObjectStore:
    """Objects in an S3-compatible bucket; presigned GET URLs from boto3."""

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix

    def put(self, key: str, data: bytes, content_type: str) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=self.prefix + key, Body=data, ContentType=content_type
        )

    def put_file(self, key: str, fileobj: BinaryIO, content_type: str) -> None:
        """boto3's managed transfer: one PUT when small, a multipart upload of 8 MiB parts
        otherwise; the object appears only once every part is in. At most
        ``S3_PART_UPLOADS`` parts are in flight, so an upload holds at most that many parts
        in memory (boto3's default of 10 would hold 80 MiB)."""
        from boto3.s3.transfer import TransferConfig

        self.client.upload_fileobj(
            fileobj,
            self.bucket,
            self.prefix + key,
            ExtraArgs={"ContentType": content_type},
            Config=TransferConfig(max_concurrency=S3_PART_UPLOADS),
        )

    def get(self, key: str) -> bytes:
        data: bytes = self._get_object(key)["Body"].read()
        return data

    def iter_chunks(self, key: str, chunk_size: int = CHUNK_BYTES) -> ObjectChunks:
        answer = self._get_object(key)
        body = answer["Body"]
        length = answer.get("ContentLength")
        return ObjectChunks(
            body.read, body.close, chunk_size, None if length is None else int(length)
        )

    def size(self, key: str) -> int:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise _object_not_found() from None
            raise
        return int(head["ContentLength"])

    def _get_object(self, key: str) -> dict[str, Any]:
        try:
            answer: dict[str, Any] = self.client.get_object(
                Bucket=self.bucket, Key=self.prefix + key
            )
        except self.client.exceptions.NoSuchKey:
            raise _object_not_found() from None
        return answer

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.prefix + key)

    def url(self, key: str, expires_in_s: int, base_url: str) -> str:
        url: str = self.client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self.prefix + key},
            ExpiresIn=expires_in_s,
        )
        return url


def s3_client(settings: GatewaySettings, **config: Any) -> Any:
    """A boto3 S3 client from ``GATEWAY_S3_*``, falling back to boto3's own chain.

    ``config`` adds botocore ``Config`` options (a probe's short timeouts, say).
    """
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region,
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=settings.s3_secret_access_key,
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": settings.s3_addressing_style},
            **config,
        ),
    )


def build_object_store(settings: GatewaySettings) -> ObjectStore:
    """The store ``GATEWAY_OBJECT_STORE`` names (the same in the gateway and the heads)."""
    if settings.object_store == "s3":
        if not settings.s3_bucket:
            raise ValueError("GATEWAY_OBJECT_STORE=s3 needs GATEWAY_S3_BUCKET")
        return S3ObjectStore(s3_client(settings), settings.s3_bucket, settings.s3_prefix)
    secret = settings.object_url_secret.encode() if settings.object_url_secret else None
    return LocalObjectStore(settings.resolved_objects_dir(), secret)
