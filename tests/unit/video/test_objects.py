"""Object stores: the local store's signed URLs as the gateway serves them, and S3 through
boto3 against a real S3-protocol server (moto's server mode) on loopback."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import boto3
import httpx
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer

from serve_app.settings import GatewaySettings
from serve_app.storage.objects import LocalObjectStore, S3ObjectStore, build_object_store
from tests.unit.video.conftest import Mp4Facts, RigFactory, VideoRig, mp4_facts

KEY = "videos/vgen_0123456789abcdef01234567.mp4"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _parts(url: str) -> tuple[str, dict[str, str]]:
    parsed = urlparse(url)
    return parsed.path, {k: v[0] for k, v in parse_qs(parsed.query).items()}


@pytest.fixture
async def served(rig: VideoRig) -> tuple[VideoRig, LocalObjectStore]:
    objects = rig.objects
    assert isinstance(objects, LocalObjectStore)
    objects.put(KEY, b"\x00\x00\x00\x18ftypisom-video-bytes", "video/mp4")
    return rig, objects


async def test_a_signed_url_serves_the_file_without_a_key(
    served: tuple[VideoRig, LocalObjectStore],
) -> None:
    rig, objects = served
    url = objects.url(KEY, 60, "http://gateway.test/")
    response = await rig.download(url)
    assert response.status_code == 200
    assert response.content.endswith(b"video-bytes")
    assert response.headers["content-type"] == "video/mp4"


async def test_expired_and_tampered_urls_are_refused(
    served: tuple[VideoRig, LocalObjectStore],
) -> None:
    rig, objects = served
    path, query = _parts(objects.url(KEY, 60, "http://gateway.test"))
    expired_at = "1000"
    cases: list[tuple[str, dict[str, str], int, str]] = [
        (path, {**query, "signature": "0" * 64}, 403, "invalid_signature"),
        (path, {**query, "expires": str(int(query["expires"]) + 1)}, 403, "invalid_signature"),
        (
            path,
            {"expires": expired_at, "signature": objects.signature(KEY, int(expired_at))},
            403,
            "url_expired",
        ),
        (path.replace("vgen_0", "vgen_1"), query, 403, "invalid_signature"),
        (path, {**query, "expires": "-5"}, 403, "invalid_signature"),
        (path, {"expires": query["expires"]}, 400, "missing_required_parameter"),
    ]
    async with rig.harness.client() as http:
        for route, params, status, code in cases:
            response = await http.get(route, params=params)
            assert (response.status_code, response.json()["error"]["code"]) == (status, code)


@pytest.mark.parametrize(
    "key",
    [
        "../gw.db",
        "videos/../../gw.db",
        "..%2Fgw.db",
        ".url-secret",
        "videos/.upload-x",
        "videos//x.mp4",
        "/etc/passwd",
        "videos/%00.mp4",
    ],
)
async def test_keys_outside_the_pattern_are_404s_even_when_signed(
    served: tuple[VideoRig, LocalObjectStore], key: str
) -> None:
    rig, objects = served
    params = {"expires": "99999999999", "signature": objects.signature(key, 99999999999)}
    async with rig.harness.client() as http:
        response = await http.get(f"/v1/video/files/{key}", params=params)
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("key", ["../gw.db", "videos/../../gw.db", "videos/./x", "a\\b", ""])
def test_the_store_itself_never_resolves_a_path_outside_its_folder(
    tmp_path: Path, key: str
) -> None:
    from serve_app.protocol.errors import NotFoundError

    store = LocalObjectStore(tmp_path / "objects", secret=b"s")
    (tmp_path / "gw.db").write_bytes(b"secret rows")
    with pytest.raises(NotFoundError):
        store.verified_path(key, "99999999999", store.signature(key, 99999999999))
    with pytest.raises(ValueError):
        store.put(key, b"x", "video/mp4")


async def test_a_signed_url_for_a_missing_file_is_a_404(
    served: tuple[VideoRig, LocalObjectStore],
) -> None:
    rig, objects = served
    response = await rig.download(objects.url("videos/gone.mp4", 60, "http://gateway.test"))
    assert (response.status_code, response.json()["error"]["code"]) == (404, "object_not_found")


def test_processes_sharing_a_folder_share_one_generated_secret(tmp_path: Path) -> None:
    first, second = LocalObjectStore(tmp_path), LocalObjectStore(tmp_path)
    assert first.signature(KEY, 10) == second.signature(KEY, 10)
    other = LocalObjectStore(tmp_path / "elsewhere")
    assert other.signature(KEY, 10) != first.signature(KEY, 10)
    configured = LocalObjectStore(tmp_path, secret=b"configured")
    assert configured.signature(KEY, 10) != first.signature(KEY, 10)
    assert (tmp_path / ".url-secret").stat().st_mode & 0o077 == 0  # not world-readable


# ---------------------------------------------------------------------------- S3 (moto server)

BUCKET = "videos-test"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1: real HTTP, real SigV4 presigned URLs."""
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_store(moto_endpoint: str) -> S3ObjectStore:
    settings = GatewaySettings(
        object_store="s3",
        s3_bucket=BUCKET,
        s3_prefix="gw/",
        s3_endpoint_url=moto_endpoint,
        s3_region="us-east-1",
        s3_access_key_id="testing",
        s3_secret_access_key="testing",
        s3_addressing_style="path",
    )
    store = build_object_store(settings)
    assert isinstance(store, S3ObjectStore)
    _client(moto_endpoint).create_bucket(Bucket=BUCKET)
    return store


def _client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
        **CREDENTIALS,
    )


def test_s3_put_presign_fetch_delete(s3_store: S3ObjectStore, moto_endpoint: str) -> None:
    s3_store.put(KEY, b"mp4-bytes", "video/mp4")
    head = _client(moto_endpoint).head_object(Bucket=BUCKET, Key=f"gw/{KEY}")
    assert head["ContentType"] == "video/mp4"
    url = s3_store.url(KEY, 300, "ignored")
    assert url.startswith(f"{moto_endpoint}/{BUCKET}/gw/videos/") and "X-Amz-Signature" in url
    fetched = httpx.get(url)
    assert (fetched.status_code, fetched.content) == (200, b"mp4-bytes")
    s3_store.delete(KEY)
    assert httpx.get(url).status_code == 404


async def test_a_job_stored_in_s3_is_downloadable_from_its_url(
    make_video_rig: RigFactory, s3_store: S3ObjectStore, moto_endpoint: str
) -> None:
    rig = await make_video_rig(objects=s3_store)
    job_id = (await rig.create(num_frames=9)).json()["id"]
    assert await rig.core.run_once()
    job = await rig.job(job_id)
    assert job["status"] == "completed"
    url = job["video"]["url"]
    assert url.startswith(moto_endpoint)
    download = await rig.download(url)
    assert download.status_code == 200
    assert mp4_facts(download.content) == Mp4Facts("h264", 9, 32, 32)
