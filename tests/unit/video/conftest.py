"""Video jobs in-process: the real gateway app and a real ``VideoHeadCore`` worker.

The worker gets its own ``Database`` on the gateway's SQLite file, as a head
replica has its own connection in production; both meet only in the
``video_jobs`` table. Tests either start the worker loop (``run_worker=True``)
or drive it one job at a time with ``core.run_once()`` so each state is
observable. Engines: ``ScriptedVideoEngine`` for the job machinery, the real
tiny Wan pipeline (built once per session) where the model path matters.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import httpx
import pytest

from deployments.video.base import VideoEngine
from deployments.video.head import VideoHeadCore, VideoWorkerOptions
from serve_app.heads.client import LocalVideoClient
from serve_app.jobs.store import JobStore
from serve_app.storage.db import Database
from serve_app.storage.objects import LocalObjectStore, ObjectStore
from tests.fakes.scripted_video import ScriptedVideoEngine
from tests.fixtures.gateway import CATALOG, GatewayHarness, add_keys, build_harness

VIDEO = "scripted-video"
UNSERVED = "unserved-video"
PRICE_PER_SECOND = 0.01
FAST = {"poll_interval_s": 0.05, "heartbeat_interval_s": 0.05, "stale_after_s": 30}


def video_catalog() -> list[dict[str, Any]]:
    entry = {
        "head": "video",
        "output_modalities": ["video"],
        "pricing": {"mode": "fixed", "per_video_second": PRICE_PER_SECOND},
        "engine": {"backend": "tests.fakes.scripted_video:ScriptedVideoEngine"},
    }
    return [{"id": VIDEO, **entry}, {"id": UNSERVED, **entry}]


@dataclass
class VideoRig:
    """A gateway, one video head worker for ``VIDEO``, and their shared stores."""

    harness: GatewayHarness
    core: VideoHeadCore
    objects: ObjectStore
    worker_db: Database

    @property
    def engine(self) -> Any:
        return self.core.engine

    def client(self, who: str = "user") -> httpx.AsyncClient:
        return self.harness.client(self.harness.keys[who])

    async def create(self, who: str = "user", **fields: Any) -> httpx.Response:
        body = {"model": VIDEO, "prompt": "a cat playing the piano", **fields}
        async with self.client(who) as http:
            return await http.post("/v1/video/generations", json=body)

    async def job(self, job_id: str, who: str = "user") -> dict[str, Any]:
        async with self.client(who) as http:
            response = await http.get(f"/v1/video/generations/{job_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def wait_status(self, job_id: str, *statuses: str, limit_s: float = 60) -> dict[str, Any]:
        """Poll the job until it reaches one of ``statuses`` (a test bound, not a timing)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while True:
            job = await self.job(job_id)
            if job["status"] in statuses:
                return job
            assert loop.time() < deadline, f"job stayed {job['status']}"
            await asyncio.sleep(0.05)

    async def download(self, url: str) -> httpx.Response:
        """Fetch ``video.url`` without an API key (local URLs are served by the app)."""
        if url.startswith("http://gateway.test/"):
            async with self.harness.client() as http:
                return await http.get(url)
        async with httpx.AsyncClient() as http:
            return await http.get(url)


RigFactory = Callable[..., Awaitable[VideoRig]]


@pytest.fixture
async def make_video_rig(tmp_path: Path) -> AsyncIterator[RigFactory]:
    """``await make_video_rig(engine=..., objects=..., video=..., run_worker=...)``;
    ``args``: more of the gateway's application args (``storage_quota``, ...)."""
    made: list[VideoRig] = []

    async def make(
        engine: VideoEngine | None = None,
        *,
        objects: ObjectStore | None = None,
        video: dict[str, Any] | None = None,
        run_worker: bool = False,
        folder: Path | None = None,
        with_head: bool = True,
        args: dict[str, Any] | None = None,
    ) -> VideoRig:
        folder = folder or tmp_path / f"gw{len(made)}"
        folder.mkdir(exist_ok=True)
        db_path = folder / "gw.db"
        options = {**FAST, **(video or {})}
        worker_db = Database(f"sqlite:///{db_path}")
        worker_db.migrate()
        store = objects or LocalObjectStore(folder / "objects")
        core = VideoHeadCore(
            VIDEO,
            engine or ScriptedVideoEngine(),
            JobStore(worker_db),
            store,
            VideoWorkerOptions.from_mapping(options),
        )
        harness = build_harness(
            db_path,
            {"catalog": [*CATALOG, *video_catalog()], "video": options, **(args or {})},
            video_heads={VIDEO: LocalVideoClient(core)} if with_head else {},
            objects=store,
        )
        add_keys(harness)
        await core.start(run_worker=run_worker)
        rig = VideoRig(harness=harness, core=core, objects=store, worker_db=worker_db)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        await rig.core.stop()
        await rig.harness.app.state.gateway.video.aclose()
        await rig.harness.aclose()
        rig.worker_db.dispose()


@pytest.fixture
async def rig(make_video_rig: RigFactory) -> VideoRig:
    return await make_video_rig()


@dataclass(frozen=True)
class Mp4Facts:
    codec: str
    frames: int
    width: int
    height: int


def mp4_facts(data: bytes) -> Mp4Facts:
    """Decode an MP4 completely with FFmpeg (PyAV): its codec, frame count and size."""
    assert data[4:8] == b"ftyp", "not an MP4 (ISO BMFF) file"
    with av.open(io.BytesIO(data), format="mp4") as container:
        stream = container.streams.video[0]
        codec = stream.codec_context.name
        decoded = list(container.decode(video=0))
    return Mp4Facts(codec, len(decoded), decoded[0].width, decoded[0].height)


@pytest.fixture(scope="session")
def tiny_video_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session folder for the tiny Wan pipeline (built by the first test that needs it)."""
    return tmp_path_factory.mktemp("tiny-video-models")
