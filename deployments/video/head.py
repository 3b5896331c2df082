"""The video head: one Ray Serve deployment per video model, running jobs from the database.

Video jobs outlive HTTP requests (docs/reference/video.md#create-a-job: one to three minutes each),
so the gateway never waits on a head: it inserts the job row (queued) and pokes the
head with a fire-and-forget ``wake``. Each head replica runs one worker loop:

1. claim the oldest queued job of its model atomically (queued -> running),
2. refresh the job's heartbeat every ``heartbeat_interval_s`` while it renders
   (a refresh that changes nothing means the job was cancelled or reconciled:
   the engine is told to stop at its next denoising step),
3. render in a worker thread (engine contract), encode the MP4, upload it to
   the object store, then mark the job completed, which also bills it,
4. on any failure mark the job failed with the error's message; when the
   replica itself is stopped (redeploy, scale-down), put the job back in the
   queue for another replica.

With nothing queued the loop sleeps until a ``wake`` or ``poll_interval_s``
(so jobs queued while no head ran, or whose poke was lost, are still found),
and fails its model's running jobs whose heartbeat went stale: a replica that
died mid-job cannot leave the job "running" forever. Every state change is a
conditional statement of the job store, so any number of replicas and gateway
replicas can act at once.

The worker knows its stores only as the contract's ``VideoJobStore`` and
``VideoObjectStore`` (``serve_app.contract.video``): the gateway's builder passes
``VideoHead`` a factory that opens the concrete ones (its ``JobStore`` and object
store, from the ``GATEWAY_*`` environment) inside the replica.

``VideoHeadCore`` is plain async Python (the gateway's tests run it in-process,
``run_once`` drives it step by step); ``VideoHead`` is the thin Serve wrapper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, fields
from typing import Any, Generic

from ray import serve

from deployments.replica_logging import configure_replica_logging
from deployments.video.base import (
    GenerationCancelled,
    VideoEngine,
    VideoEngineInfo,
    resolve_params,
)
from deployments.video.mp4 import MP4_CONTENT_TYPE, encode_mp4
from serve_app.contract.errors import GatewayError
from serve_app.contract.video import (
    JobT,
    VideoJobStore,
    VideoObjectStore,
    VideoStoresFactory,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VideoWorkerOptions:
    """The worker's pacing (from ``args.video``, shared with the gateway)."""

    poll_interval_s: float = 2.0
    heartbeat_interval_s: float = 2.0
    stale_after_s: float = 60.0

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> VideoWorkerOptions:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


def object_key(job_id: str) -> str:
    return f"videos/{job_id}.mp4"


class VideoHeadCore(Generic[JobT]):
    """The worker loop around one ``VideoEngine``; ``JobT`` is the job type of ``jobs``."""

    def __init__(
        self,
        model_id: str,
        engine: VideoEngine,
        jobs: VideoJobStore[JobT],
        objects: VideoObjectStore,
        options: VideoWorkerOptions | None = None,
    ) -> None:
        self.model_id = model_id
        self.engine = engine
        self.jobs = jobs
        self.objects = objects
        self.options = options or VideoWorkerOptions()
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.info: VideoEngineInfo | None = None
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self, *, run_worker: bool = True) -> VideoEngineInfo:
        """Load the engine, then (unless told not to) start the worker loop."""
        self.info = await self.engine.start()
        if run_worker:
            self._loop_task = asyncio.get_running_loop().create_task(self._work_loop())
        return self.info

    def wake(self) -> None:
        """A job was queued: look now instead of at the next poll."""
        self._wake.set()

    def check_worker(self) -> None:
        """Raise when the worker loop has died (the replica is then restarted)."""
        task = self._loop_task
        if task is not None and task.done() and not self._stopping:
            raise RuntimeError(f"the video worker of {self.model_id} stopped: {task!r}")

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        task = self._loop_task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _work_loop(self) -> None:
        logger.info("video worker %s polling for %s jobs", self.worker_id, self.model_id)
        while not self._stopping:
            try:
                ran = await self.run_once()
            except Exception:  # a database outage: keep the loop alive, retry later
                logger.exception("video worker of %s failed a round", self.model_id)
                ran = False
            if not ran:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.options.poll_interval_s)

    async def run_once(self) -> bool:
        """Claim and run one queued job; False (after reconciling) when none is queued."""
        job = await asyncio.to_thread(self.jobs.claim_next, self.model_id, self.worker_id)
        if job is None:
            failed = await asyncio.to_thread(
                self.jobs.fail_stale, self.options.stale_after_s, model=self.model_id
            )
            if failed:
                logger.warning("%d %s job(s) failed: their worker died", failed, self.model_id)
            return False
        await self.run_job(job)
        return True

    async def run_job(self, job: JobT) -> None:
        """Render, encode, upload and finish one claimed job; never raises."""
        stop = threading.Event()
        beat = asyncio.get_running_loop().create_task(self._heartbeat(job.id, stop))
        started = time.monotonic()
        try:
            await self._render_and_store(job, stop, started)
        except asyncio.CancelledError:  # the replica is stopping: hand the job back
            stop.set()
            await asyncio.shield(asyncio.to_thread(self.jobs.release, job.id, self.worker_id))
            logger.info("job %s put back in the queue: this replica is stopping", job.id)
            raise
        except GenerationCancelled:
            logger.info("job %s stopped: it was cancelled or taken away", job.id)
        except GatewayError as err:
            await self._fail(job, err.message)
        except Exception as err:
            logger.exception("job %s failed", job.id)
            await self._fail(job, f"Video generation failed ({type(err).__name__}): {err}")
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    async def _render_and_store(self, job: JobT, stop: threading.Event, started: float) -> None:
        if self.info is None:
            raise RuntimeError("the video engine was not started")
        params = resolve_params(job.request(), self.info)
        logger.info(
            "job %s: %dx%d, %d frames at %d fps, %d steps",
            job.id,
            params.width,
            params.height,
            params.num_frames,
            params.fps,
            params.num_inference_steps,
        )
        video = await self.engine.generate(params, stop.is_set)
        data = await asyncio.to_thread(encode_mp4, video.frames, video.fps)
        key = object_key(job.id)
        await asyncio.to_thread(self.objects.put, key, data, MP4_CONTENT_TYPE)
        seconds = round(len(video.frames) / video.fps, 3)
        gen_seconds = round(time.monotonic() - started, 3)
        done = await asyncio.to_thread(
            self.jobs.complete, job, self.worker_id, key, seconds, gen_seconds, len(data)
        )
        if done:
            logger.info("job %s completed: %.2f s of video in %.1f s", job.id, seconds, gen_seconds)
        else:  # cancelled (or reconciled) while encoding or uploading: nobody will read it
            logger.info("job %s finished after it was cancelled; discarding its video", job.id)
            await asyncio.to_thread(self.objects.delete, key)

    async def _heartbeat(self, job_id: str, stop: threading.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(self.options.heartbeat_interval_s)
            try:
                alive = await asyncio.to_thread(self.jobs.heartbeat, job_id, self.worker_id)
            except Exception:
                logger.warning("heartbeat of job %s not recorded", job_id, exc_info=True)
                continue
            if not alive:
                stop.set()

    async def _fail(self, job: JobT, message: str) -> None:
        try:
            await asyncio.to_thread(self.jobs.fail, job.id, self.worker_id, message)
        except Exception:  # the job then goes stale and is failed by reconciliation
            logger.exception("could not record the failure of job %s", job.id)


@serve.deployment(ray_actor_options={"num_cpus": 0.5})
class VideoHead:
    """Ray Serve replica hosting one video engine and its worker loop."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits async constructors
        self,
        model_id: str,
        backend: str,
        engine_config: dict[str, Any],
        options: dict[str, Any] | None,
        open_stores: VideoStoresFactory,
    ) -> None:
        configure_replica_logging()
        from deployments import registry

        # The builder's factory opens the gateway's own job and object stores here, in
        # the replica (blocking: it migrates the database), from the same GATEWAY_*
        # environment as the gateway's (inherited from the driver, or the runtime_env).
        jobs, objects = await asyncio.to_thread(open_stores)
        self.core: VideoHeadCore[Any] = VideoHeadCore(
            model_id,
            registry.build_engine("video", backend, engine_config),
            jobs,
            objects,
            VideoWorkerOptions.from_mapping(options or {}),
        )
        info = await self.core.start()
        logger.info(
            "video head %s ready (default %dx%d)",
            model_id,
            info.defaults.width,
            info.defaults.height,
        )

    async def wake(self) -> None:
        self.core.wake()

    async def check_health(self) -> None:
        await self.core.engine.check_health()
        self.core.check_worker()

    async def __del__(self) -> None:
        await self.core.stop()
        await self.core.engine.shutdown()
