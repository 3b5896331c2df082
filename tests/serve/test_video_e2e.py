"""End to end: a video job on the Ray Serve stack, over raw HTTP, to a playable MP4.

The gateway queues the job in SQL, the ``wan-tiny-video`` head (its own Ray
actor running diffusers' WanPipeline on the tiny local model) claims, renders,
encodes and stores it in the local object store, and the signed ``video.url``
is served back by the gateway through Serve's HTTP proxy.
"""

from __future__ import annotations

import io
import time

import av
import pytest

from tests.serve.conftest import WAN_VIDEO, ServeStack

pytestmark = pytest.mark.serve


def test_a_job_is_polled_to_completion_and_its_url_serves_an_mp4(
    serve_stack: ServeStack,
) -> None:
    with serve_stack.http() as http:
        created = http.post(
            "/v1/video/generations",
            json={"model": WAN_VIDEO, "prompt": "a lighthouse at dusk", "num_frames": 9},
        )
        assert created.status_code == 202, created.text
        job_id = created.json()["id"]
        deadline = time.monotonic() + 240  # the head may still be loading diffusers
        while True:
            job = http.get(f"/v1/video/generations/{job_id}").json()
            if job["status"] not in ("queued", "running") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert job["status"] == "completed", job
        listed = http.get("/v1/video/generations").json()["data"]
        assert listed[0]["id"] == job_id

    video = job["video"]
    assert video["seconds"] == pytest.approx(9 / 8)
    with serve_stack.http(key="not-a-key") as anonymous:  # the signed URL needs no key
        download = anonymous.get(video["url"])
    assert download.status_code == 200, download.text
    assert download.headers["content-type"] == "video/mp4"
    with av.open(io.BytesIO(download.content), format="mp4") as container:
        assert container.streams.video[0].codec_context.name == "h264"
        frames = list(container.decode(video=0))
    assert (len(frames), frames[0].width, frames[0].height) == (9, 32, 32)
