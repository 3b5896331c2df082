"""Video generation jobs for the routes of docs/reference/video.md: create, list, read, cancel.

The gateway never runs a job: ``create`` validates, resolves the model,
applies the rate limits, inserts the job under the per-user cap (atomic, in
``JobStore.create``) and pokes the model's head; the head's worker does the
rest (``deployments.video.head``). Everything lives in the SQL database, so a
gateway replica can restart, or another replica answer the next poll, and
nothing is lost.

Reading a job reconciles it with the worker side before answering:

- running with a heartbeat older than ``stale_after_s``: its worker died; the
  job becomes failed with a message saying so;
- queued for longer than ``unclaimed_timeout_s`` while the model's head is not
  ready (failed, still starting, or absent): it becomes failed too.

A completed job's ``video.url`` is resolved afresh on every read (a new
signature or presigned URL with a new expiry). Jobs belong to the user of the
key in the organization of the key: another user's job, or the same user's job made
under another organization, is a 404 with exactly the body of a missing one.

A job's MP4 counts in its organization's storage quota (``serve_app.storage.quotas``):
a create is refused while the organization is at a bound, and deleting the job frees
its file.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path

from serve_app.auth.principal import Principal
from serve_app.catalog.catalog import Catalog
from serve_app.catalog.config import CatalogModel
from serve_app.config import VideoOptions
from serve_app.contract.video import round_num_frames
from serve_app.heads.client import VideoHeadClient
from serve_app.inference.answers import Body
from serve_app.inference.metering import Metering, RequestMeta
from serve_app.inference.readiness import HeadReadiness
from serve_app.inference.unary_metering import UnaryMetering
from serve_app.jobs.records import (
    COMPLETED,
    FAILED,
    QUEUED,
    RUNNING,
    JobOwner,
    VideoJob,
    new_job_id,
    valid_job_id,
)
from serve_app.jobs.store import JobStore
from serve_app.protocol.errors import (
    ModelUnavailableError,
    NotFoundError,
    PermissionDeniedError,
    video_job_not_found,
    video_jobs_quota_exceeded,
)
from serve_app.protocol.headers import ignored_params_header
from serve_app.protocol.video import (
    MAX_SEED,
    VideoGenerationDeleted,
    VideoGenerationJob,
    VideoGenerationJobList,
    VideoGenerationRequest,
    VideoJobError,
    VideoResult,
)
from serve_app.storage.objects import LocalObjectStore, ObjectStore
from serve_app.storage.quotas import StorageQuotas

logger = logging.getLogger(__name__)

ENDPOINT = "video"
UNCLAIMED_MESSAGE = (
    "No video worker started this job within {s:g} s: the model's head is unavailable."
)


class VideoService:
    """Serves the video routes for the catalog's video models."""

    def __init__(
        self,
        catalog: Catalog,
        heads: dict[str, VideoHeadClient],
        readiness: HeadReadiness,
        jobs: JobStore,
        objects: ObjectStore,
        options: VideoOptions,
        *,
        url_expiry_s: int = 3600,
        public_base_url: str | None = None,
        metering: Metering | None = None,
        quotas: StorageQuotas | None = None,
    ) -> None:
        self.catalog = catalog
        self.heads = heads
        self.readiness = readiness
        self.jobs = jobs
        self.objects = objects
        self.options = options
        self.url_expiry_s = url_expiry_s
        self.public_base_url = public_base_url
        self.usage = UnaryMetering(metering or Metering())
        self.quotas = quotas
        self._pokes: set[asyncio.Task[None]] = set()

    # ---- routes ---------------------------------------------------------------------
    async def create(
        self, body: VideoGenerationRequest, principal: Principal, base_url: str
    ) -> Body:
        model = self.catalog.resolve(body.model, principal, "video")
        client = self._head_for(model)
        job = self._new_job(body, principal, model)
        meta = RequestMeta(principal, model, ENDPOINT, job.id, 1)
        await self._admit(meta)
        options = self.options
        metrics = self.usage.metering.metrics
        if self.quotas is not None:
            try:
                await asyncio.to_thread(self.quotas.check_new_video, principal.org_id)
            except PermissionDeniedError:
                metrics.request(model.id, ENDPOINT, "rejected")
                raise
        created = await asyncio.to_thread(
            self.jobs.create, job, options.max_unfinished_jobs_per_user, options.stale_after_s
        )
        if not created:
            err = video_jobs_quota_exceeded(
                options.max_unfinished_jobs_per_user, options.quota_retry_after_s
            )
            metrics.rate_limited(model.id, err.code or "video_jobs_quota_exceeded")
            metrics.request(model.id, ENDPOINT, "rejected")
            raise err
        metrics.request(model.id, ENDPOINT, "ok")
        logger.info("video job %s queued for %s by %s", job.id, model.id, principal.user_id)
        self._poke(client)
        headers = ignored_params_header(body.extra_fields())
        return self._json(job, base_url, status_code=202, headers=headers)

    async def list_recent(self, principal: Principal, base_url: str) -> Body:
        owner, limit = _owner(principal), self.options.list_limit
        jobs = await asyncio.to_thread(self.jobs.list_recent, owner, limit)
        if any(self._needs_reconcile(j) for j in jobs):
            await self._reconcile(principal.user_id, jobs)
            jobs = await asyncio.to_thread(self.jobs.list_recent, owner, limit)
        listing = VideoGenerationJobList(data=[self.view(j, base_url) for j in jobs])
        return Body.json(listing.model_dump(exclude_none=True))

    async def get(self, job_id: str, principal: Principal, base_url: str) -> Body:
        job = await self._own(job_id, principal)
        if job.status == QUEUED:  # a client waiting on it wakes a head that sleeps when idle
            self._head_ready(job.model)
        if self._needs_reconcile(job):
            await self._reconcile(principal.user_id, [job])
            job = await self._own(job_id, principal)
        return self._json(job, base_url)

    async def cancel(self, job_id: str, principal: Principal, base_url: str) -> Body:
        if not valid_job_id(job_id):
            raise video_job_not_found(job_id)
        job = await asyncio.to_thread(self.jobs.cancel, job_id, _owner(principal))
        if job is None:
            raise video_job_not_found(job_id)
        return self._json(job, base_url)

    async def delete(self, job_id: str, principal: Principal) -> Body:
        """Remove the caller's job and its file, whatever its status (an unfinished one
        stops: its worker finds the row gone); the file no longer counts in the quota."""
        job = None
        if valid_job_id(job_id):
            job = await asyncio.to_thread(self.jobs.delete, job_id, _owner(principal))
        if job is None:
            raise video_job_not_found(job_id)
        if job.object_key:
            try:
                await asyncio.to_thread(self.objects.delete, job.object_key)
            except Exception:  # an orphaned object costs storage, not correctness
                logger.warning("video %s of deleted job %s not removed", job.object_key, job.id)
        return Body.json(VideoGenerationDeleted(id=job.id).model_dump())

    def local_file(self, key: str, expires: str, signature: str) -> Path:
        """The file a signed local URL names (404 when videos are not stored locally)."""
        if not isinstance(self.objects, LocalObjectStore):
            raise NotFoundError("No such file.", code="object_not_found")
        return self.objects.verified_path(key, expires, signature)

    async def aclose(self) -> None:
        for task in list(self._pokes):
            task.cancel()

    # ---- rendering --------------------------------------------------------------------
    def view(self, job: VideoJob, base_url: str) -> VideoGenerationJob:
        """docs/reference/video.md#job; a completed job gets a freshly signed URL."""
        video = None
        if job.status == COMPLETED and job.object_key:
            url = self.objects.url(
                job.object_key, self.url_expiry_s, self.public_base_url or base_url
            )
            video = VideoResult(
                url=url, seconds=job.seconds or 0.0, gen_seconds=job.gen_seconds or 0.0
            )
        error = VideoJobError(message=job.error or "failed") if job.status == FAILED else None
        return VideoGenerationJob(
            id=job.id,
            model=job.model,
            created=int(job.created_at.timestamp()),
            status=job.status,  # type: ignore[arg-type]  # a CHECK constraint bounds it
            error=error,
            video=video,
        )

    def _json(
        self,
        job: VideoJob,
        base_url: str,
        status_code: int = 200,
        headers: dict[str, str] | None = None,
    ) -> Body:
        body = self.view(job, base_url).model_dump(exclude_none=True)
        return Body.json(body, status_code=status_code, headers=headers)

    # ---- helpers --------------------------------------------------------------------
    def _head_for(self, model: CatalogModel) -> VideoHeadClient:
        """The model's head; a head still starting is fine (the job waits in the queue)."""
        client = self.heads.get(model.id)
        if client is None:
            raise ModelUnavailableError(f"Model '{model.id}' has no serving head.")
        try:
            self.readiness.check(model.id)
        except ModelUnavailableError as err:
            if err.code != "model_warming":
                raise
        return client

    def _head_ready(self, model_id: str) -> bool:
        if model_id not in self.heads:
            return False
        try:
            self.readiness.check(model_id)
        except ModelUnavailableError:
            return False
        return True

    def _new_job(
        self, body: VideoGenerationRequest, principal: Principal, model: CatalogModel
    ) -> VideoJob:
        return VideoJob(
            id=new_job_id(),
            user_id=principal.user_id,
            key_id=principal.key_id,
            org_id=principal.org_id,
            model=model.id,
            status=QUEUED,
            prompt=body.prompt,
            negative_prompt=body.negative_prompt,
            width=body.width,
            height=body.height,
            num_frames=None if body.num_frames is None else round_num_frames(body.num_frames),
            fps=body.fps,
            num_inference_steps=body.num_inference_steps,
            seed=body.seed if body.seed is not None else secrets.randbelow(MAX_SEED + 1),
            pricing=model.pricing.model_dump_json(),
            created_at=self.jobs.now(),
        )

    async def _admit(self, meta: RequestMeta) -> None:
        """Rate limits (docs/reference/video.md#create-a-job: a create is one request, counted even
        if the job quota then refuses it); nothing to settle later."""
        ticket = await self.usage.admit(meta, 0)
        limiter = self.usage.metering.limiter
        if limiter is not None:
            await limiter.settle(ticket, 0)

    async def _own(self, job_id: str, principal: Principal) -> VideoJob:
        job = None
        if valid_job_id(job_id):
            job = await asyncio.to_thread(self.jobs.get, job_id, _owner(principal))
        if job is None:
            raise video_job_not_found(job_id)
        return job

    def _needs_reconcile(self, job: VideoJob) -> bool:
        now = self.jobs.now()
        if job.status == RUNNING and job.heartbeat_at is not None:
            return (now - job.heartbeat_at).total_seconds() > self.options.stale_after_s
        if job.status == QUEUED:
            waited = (now - job.created_at).total_seconds()
            return waited > self.options.unclaimed_timeout_s and not self._head_ready(job.model)
        return False

    async def _reconcile(self, user_id: str, jobs: list[VideoJob]) -> None:
        """Fail this user's dead jobs (the store re-checks every condition)."""
        options = self.options
        await asyncio.to_thread(self.jobs.fail_stale, options.stale_after_s, user_id=user_id)
        stuck = {j.model for j in jobs if j.status == QUEUED and self._needs_reconcile(j)}
        message = UNCLAIMED_MESSAGE.format(s=options.unclaimed_timeout_s)
        for model in sorted(stuck):
            await asyncio.to_thread(
                self.jobs.fail_unclaimed,
                model,
                options.unclaimed_timeout_s,
                message,
                user_id=user_id,
            )

    def _poke(self, client: VideoHeadClient) -> None:
        """Wake the head without waiting for it (a lost poke costs one poll interval)."""
        task = asyncio.get_running_loop().create_task(client.wake())
        self._pokes.add(task)
        task.add_done_callback(self._pokes.discard)


def _owner(principal: Principal) -> JobOwner:
    """The caller as a job owner: their user in the organization of their key."""
    return JobOwner(user_id=principal.user_id, org_id=principal.org_id)
