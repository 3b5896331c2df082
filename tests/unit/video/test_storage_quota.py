"""Generated videos count in their organization's storage quota (serve_app/storage/quotas.py):
a completed job's MP4 is one object of its size, a new job is refused with 403
``storage_quota_exceeded`` while the organization is at a bound (files and adapters share
it), and ``DELETE /v1/video/generations/{id}`` removes the job and its file, freeing both."""

from __future__ import annotations

import asyncio

import httpx

from deployments.video.head import object_key
from serve_app.jobs.store import JobStore
from serve_app.protocol.errors import video_job_not_found
from serve_app.storage.objects import LocalObjectStore
from serve_app.storage.quotas import StorageQuotas, StoredUsage
from tests.fakes.scripted_video import ScriptedVideoEngine
from tests.unit.video.conftest import RigFactory, VideoRig


def org_of(rig: VideoRig, who: str) -> str:
    gateway = rig.harness.app.state.gateway
    org_id: str = gateway.auth.authenticate(f"Bearer {rig.harness.keys[who]}").org_id
    return org_id


def usage(rig: VideoRig, job_id: str) -> StoredUsage:
    """What the organization of ``job_id`` stores (the user key's: the row may be gone)."""
    org_id = org_of(rig, "user")
    job = JobStore(rig.worker_db).get(job_id)
    assert job is None or job.org_id == org_id
    quotas: StorageQuotas = rig.harness.app.state.gateway.files.quotas
    return quotas.usage(org_id)


def stored(rig: VideoRig, job_id: str) -> bytes | None:
    assert isinstance(rig.objects, LocalObjectStore)
    path = rig.objects.root / object_key(job_id)
    return path.read_bytes() if path.exists() else None


async def completed_job(rig: VideoRig, who: str = "user") -> str:
    created = await rig.create(who)
    assert created.status_code == 202, created.text
    assert await rig.core.run_once()
    job_id: str = created.json()["id"]
    assert (await rig.job(job_id, who))["status"] == "completed"
    return job_id


def assert_video_refusal(answer: httpx.Response) -> None:
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert {k: v for k, v in error.items() if k != "message"} == {
        "type": "permission_error",
        "code": "storage_quota_exceeded",
        "param": None,
    }
    assert "video" in error["message"]


async def upload_file(rig: VideoRig, data: bytes) -> httpx.Response:
    async with rig.client() as http:
        return await http.post(
            "/v1/files",
            files={"file": ("in.jsonl", data, "application/jsonl")},
            data={"purpose": "batch"},
        )


async def delete(rig: VideoRig, job_id: str, who: str = "user") -> httpx.Response:
    async with rig.client(who) as http:
        return await http.delete(f"/v1/video/generations/{job_id}")


async def test_a_completed_video_counts_as_one_object_of_its_size(rig: VideoRig) -> None:
    queued = (await rig.create()).json()["id"]
    assert usage(rig, queued) == StoredUsage(bytes=0, objects=0)  # no file yet: nothing held
    assert await rig.core.run_once()
    data = stored(rig, queued)
    assert data is not None and len(data) > 0
    assert usage(rig, queued) == StoredUsage(bytes=len(data), objects=1)
    quotas = rig.harness.app.state.gateway.files.quotas
    assert quotas.usage(org_of(rig, "external")) == StoredUsage(bytes=0, objects=0)


async def test_a_video_job_is_refused_while_the_organization_is_at_its_object_bound(
    make_video_rig: RigFactory,
) -> None:
    rig = await make_video_rig(args={"storage_quota": {"max_objects_per_org": 1}})
    first = await completed_job(rig)
    assert_video_refusal(await rig.create())
    assert (await upload_file(rig, b"{}\n")).status_code == 403  # one bound with files
    async with rig.client() as http:
        listed = (await http.get("/v1/video/generations")).json()["data"]
    assert [j["id"] for j in listed] == [first]  # the refused job was never queued
    other = await rig.create("external")  # another organization has its own room
    assert other.status_code == 202, other.text


async def test_a_video_job_is_refused_once_stored_bytes_reach_the_bound(
    make_video_rig: RigFactory,
) -> None:
    """The accepted job's file is stored whatever its size; the next job is refused."""
    rig = await make_video_rig(args={"storage_quota": {"max_bytes_per_org": 1000}})
    first = await completed_job(rig)
    size = len(stored(rig, first) or b"")
    assert size > 1000  # the scripted MP4: the organization is now over its bound
    assert usage(rig, first).bytes == size
    assert_video_refusal(await rig.create())
    refused = await upload_file(rig, b"{}\n")
    assert (
        refused.status_code == 403 and f"stores {size} bytes" in refused.json()["error"]["message"]
    )


async def test_deleting_a_video_frees_its_bytes_and_its_object(
    make_video_rig: RigFactory,
) -> None:
    rig = await make_video_rig(args={"storage_quota": {"max_objects_per_org": 1}})
    first = await completed_job(rig)
    assert_video_refusal(await rig.create())
    foreign = await delete(rig, first, "external")  # another organization's: a missing job
    assert foreign.status_code == 404
    assert foreign.json() == video_job_not_found(first).envelope()
    assert stored(rig, first) is not None

    deleted = await delete(rig, first)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"id": first, "object": "video.generation.deleted", "deleted": True}
    assert stored(rig, first) is None
    assert usage(rig, first) == StoredUsage(bytes=0, objects=0)
    async with rig.client() as http:
        assert (await http.get(f"/v1/video/generations/{first}")).status_code == 404
    assert (await delete(rig, first)).status_code == 404  # gone
    assert (await rig.create()).status_code == 202  # room again


async def test_a_job_deleted_while_rendering_leaves_no_file_behind(
    make_video_rig: RigFactory,
) -> None:
    rig = await make_video_rig(ScriptedVideoEngine({"hold": True}))
    job_id = (await rig.create()).json()["id"]
    worker = asyncio.create_task(rig.core.run_once())
    await asyncio.to_thread(rig.engine.rendering.wait, 30)
    assert (await delete(rig, job_id)).status_code == 200
    rig.engine.release()
    await worker
    assert stored(rig, job_id) is None  # stopped by its heartbeat, or its upload removed
    assert usage(rig, job_id) == StoredUsage(bytes=0, objects=0)
