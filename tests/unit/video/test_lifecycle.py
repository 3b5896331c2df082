"""A job's life through the gateway and a real head worker: queued, running, completed,
cancelled, failed; the MP4 behind ``video.url``; billing on completion."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from deployments.video.head import VideoHeadCore
from serve_app.billing.store import LedgerStore
from serve_app.jobs.store import JobStore
from serve_app.protocol.errors import model_warming
from serve_app.storage.objects import LocalObjectStore
from tests.fakes.scripted_video import ScriptedVideoEngine
from tests.unit.video.conftest import (
    PRICE_PER_SECOND,
    VIDEO,
    Mp4Facts,
    RigFactory,
    VideoRig,
    mp4_facts,
)


async def test_queued_running_completed_with_a_playable_mp4(make_video_rig: RigFactory) -> None:
    rig = await make_video_rig(ScriptedVideoEngine({"hold": True}))
    created = await rig.create(width=48, height=32, num_frames=17, fps=10)
    assert created.status_code == 202
    job_id = created.json()["id"]
    assert (await rig.job(job_id))["status"] == "queued"

    worker = asyncio.create_task(rig.core.run_once())
    await asyncio.to_thread(rig.engine.rendering.wait, 30)
    running = await rig.job(job_id)
    assert running["status"] == "running" and "video" not in running
    rig.engine.release()
    assert await worker

    done = await rig.job(job_id)
    assert done["status"] == "completed" and "error" not in done
    video = done["video"]
    assert video["seconds"] == pytest.approx(17 / 10)
    assert video["gen_seconds"] >= 0
    download = await rig.download(video["url"])
    assert download.status_code == 200
    assert download.headers["content-type"] == "video/mp4"
    assert mp4_facts(download.content) == Mp4Facts("h264", 17, 48, 32)

    record = LedgerStore(rig.worker_db).get(job_id)
    assert record is not None and record.video_seconds == pytest.approx(1.7)
    assert record.cost == pytest.approx(1.7 * PRICE_PER_SECOND)


async def test_the_worker_loop_is_woken_by_a_create(make_video_rig: RigFactory) -> None:
    rig = await make_video_rig(run_worker=True, video={"poll_interval_s": 30})
    job_id = (await rig.create()).json()["id"]
    done = await rig.wait_status(job_id, "completed", "failed")
    assert done["status"] == "completed", done
    facts = mp4_facts((await rig.download(done["video"]["url"])).content)
    assert (facts.codec, facts.frames) == ("h264", 9)


async def test_every_read_resolves_a_fresh_url(make_video_rig: RigFactory, tmp_path: Path) -> None:
    now = [1_000_000.0]
    objects = LocalObjectStore(tmp_path / "objects", clock=lambda: now[0])
    rig = await make_video_rig(objects=objects, video={"poll_interval_s": 30})
    job_id = (await rig.create()).json()["id"]
    assert await rig.core.run_once()
    first = (await rig.job(job_id))["video"]["url"]
    now[0] += 5
    second = (await rig.job(job_id))["video"]["url"]
    assert first != second
    expiries = [int(parse_qs(urlparse(u).query)["expires"][0]) for u in (first, second)]
    assert expiries[1] - expiries[0] == 5
    async with rig.client() as http:
        listed = (await http.get("/v1/video/generations")).json()["data"][0]["video"]["url"]
    assert listed.startswith("http://gateway.test/v1/video/files/videos/")


async def test_cancel_a_queued_job(rig: VideoRig) -> None:
    job_id = (await rig.create()).json()["id"]
    async with rig.client() as http:
        response = await http.post(f"/v1/video/generations/{job_id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled" and response.json()["id"] == job_id
    assert not await rig.core.run_once()  # nothing left to claim
    assert rig.engine.seen == []


async def test_cancel_a_running_job_stops_the_engine(make_video_rig: RigFactory) -> None:
    rig = await make_video_rig(ScriptedVideoEngine({"hold": True}))
    job_id = (await rig.create(num_inference_steps=50)).json()["id"]
    worker = asyncio.create_task(rig.core.run_once())
    await asyncio.to_thread(rig.engine.rendering.wait, 30)
    async with rig.client() as http:
        cancelled = await http.post(f"/v1/video/generations/{job_id}/cancel")
    assert cancelled.json()["status"] == "cancelled"
    await asyncio.wait_for(worker, 30)  # the heartbeat saw it; the engine stopped mid-render
    job = await rig.job(job_id)
    assert job["status"] == "cancelled" and "video" not in job
    assert isinstance(rig.objects, LocalObjectStore)
    assert not (rig.objects.root / "videos" / f"{job_id}.mp4").exists()
    assert LedgerStore(rig.worker_db).get(job_id) is None  # nothing billed


async def test_cancel_after_completion_keeps_the_video(rig: VideoRig) -> None:
    job_id = (await rig.create()).json()["id"]
    assert await rig.core.run_once()
    async with rig.client() as http:
        response = await http.post(f"/v1/video/generations/{job_id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "completed" and "url" in response.json()["video"]


async def test_an_engine_failure_fails_the_job_with_its_message(
    make_video_rig: RigFactory,
) -> None:
    rig = await make_video_rig(ScriptedVideoEngine({"fail": "out of GPU memory"}))
    job_id = (await rig.create()).json()["id"]
    assert await rig.core.run_once()
    job = await rig.job(job_id)
    assert job["status"] == "failed" and "video" not in job
    assert "out of GPU memory" in job["error"]["message"]
    assert LedgerStore(rig.worker_db).get(job_id) is None
    assert (await rig.create()).status_code == 202  # a failed job frees the cap


async def test_jobs_survive_a_gateway_restart(make_video_rig: RigFactory, tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    first = await make_video_rig(folder=folder)
    job_id = (await first.create()).json()["id"]
    await first.harness.aclose()  # the gateway replica goes away with the job queued

    second = await make_video_rig(folder=folder)  # a new replica, same database
    second.harness.keys.update(first.harness.keys)
    assert (await second.job(job_id))["status"] == "queued"
    assert await second.core.run_once()
    assert (await second.job(job_id))["status"] == "completed"


async def test_a_job_whose_worker_died_is_failed_on_read(make_video_rig: RigFactory) -> None:
    rig = await make_video_rig(video={"stale_after_s": 60})
    first = (await rig.create()).json()["id"]
    second = (await rig.create()).json()["id"]
    assert (await rig.create()).status_code == 429
    # A replica that claimed both jobs and then died: its last heartbeats are an hour old.
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    dead = JobStore(rig.worker_db, clock=lambda: hour_ago)
    assert dead.claim_next(VIDEO, "dead-replica") is not None
    assert dead.claim_next(VIDEO, "dead-replica") is not None

    job = await rig.job(first)
    assert job["status"] == "failed"
    assert "stopped responding" in job["error"]["message"]
    # Creating reconciles too: the dead worker does not hold the user's quota.
    assert (await rig.create()).status_code == 202
    assert (await rig.job(second))["status"] == "failed"


async def test_a_job_no_worker_can_take_is_failed_on_read(
    make_video_rig: RigFactory, tmp_path: Path
) -> None:
    folder = tmp_path / "shared"
    served = await make_video_rig(folder=folder)
    job_id = (await served.create()).json()["id"]
    # The head is gone (no serving head in this replica's view) and the job is past due.
    orphaned = await make_video_rig(
        folder=folder, with_head=False, video={"unclaimed_timeout_s": 0.001}
    )
    orphaned.harness.keys.update(served.harness.keys)
    await asyncio.sleep(0.01)
    job = await orphaned.job(job_id)
    assert job["status"] == "failed"
    assert "No video worker started this job" in job["error"]["message"]
    # While a head serves the model, a queued job waits however long it takes.
    waiting_id = (await served.create()).json()["id"]
    patient = await make_video_rig(folder=folder, video={"unclaimed_timeout_s": 0.001})
    patient.harness.keys.update(served.harness.keys)
    await asyncio.sleep(0.01)
    assert (await patient.job(waiting_id))["status"] == "queued"


async def test_a_stopping_replica_hands_its_job_back(make_video_rig: RigFactory) -> None:
    rig = await make_video_rig(ScriptedVideoEngine({"hold": True}), run_worker=True)
    job_id = (await rig.create()).json()["id"]
    await asyncio.to_thread(rig.engine.rendering.wait, 30)
    assert (await rig.job(job_id))["status"] == "running"
    await rig.core.stop()  # a redeploy or scale-down stops the replica mid-render
    assert (await rig.job(job_id))["status"] == "queued"
    successor = VideoHeadCore(VIDEO, ScriptedVideoEngine(), JobStore(rig.worker_db), rig.objects)
    await successor.start(run_worker=False)
    assert await successor.run_once()
    assert (await rig.job(job_id))["status"] == "completed"


async def test_reading_a_queued_job_wakes_a_sleeping_head(rig: VideoRig) -> None:
    """A job put back in the queue when its head was scaled down (or queued while the head
    slept) is taken again once its head is up: a client polling the job wakes it."""
    service = rig.harness.app.state.gateway.video
    checked: list[str] = []

    class Asleep:
        def check(self, model_id: str) -> None:
            checked.append(model_id)  # the real readiness wakes the head here
            raise model_warming(model_id, 10)

    service.readiness = Asleep()
    job_id = (await rig.create()).json()["id"]
    assert checked == [VIDEO]  # the create
    assert (await rig.job(job_id))["status"] == "queued"
    assert checked == [VIDEO, VIDEO]  # and the read
