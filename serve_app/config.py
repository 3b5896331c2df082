"""Typed arguments of the gateway application (the ``args:`` of a Serve config).

``serve deploy configs/local.yaml`` hands the YAML's ``args`` to
``serve_app.builders.build_gateway_app``, which validates them here first:
``extra="forbid"`` everywhere so a typo fails the deploy with a clear message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.auth.oidc_config import DashboardOptions
from serve_app.catalog.config import CatalogModel
from serve_app.dedicated.options import DedicatedOptions
from serve_app.tools.config import ToolsOptions

REPO_ROOT = Path(__file__).resolve().parent.parent


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class IngressOptions(_Strict):
    """Ray Serve options of the stateless gateway ingress."""

    num_replicas: int = Field(default=1, ge=1, description="Gateway replicas (stateless).")
    max_ongoing_requests: int = Field(default=256, ge=1, description="Admission per replica.")
    ray_actor_options: dict[str, Any] = Field(
        default_factory=lambda: {"num_cpus": 0.5}, description="Resources per gateway replica."
    )


class ToolRunnerOptions(_Strict):
    """The code_interpreter sandbox's own deployment (``deployments.tool_runner``).

    Untrusted code runs in these replicas, not in the ingress: on a cluster they ask for a
    node type that has bubblewrap and slirp4netns (cluster.yaml's ``tool_runner_host``).
    """

    enabled: bool = Field(
        default=True,
        description="false: no tool-runner deployment; each gateway replica runs the sandbox "
        "itself (a one-process setup only: the ingress then runs untrusted code).",
    )
    num_replicas: int = Field(default=1, ge=1, description="Tool-runner replicas.")
    max_ongoing_requests: int = Field(
        default=8, ge=1, description="Sandbox runs one replica carries at once."
    )
    ray_actor_options: dict[str, Any] = Field(
        # A fraction: on a 2-core machine a whole CPU per replica leaves heads pending.
        default_factory=lambda: {"num_cpus": 0.1},
        description="Resources per replica; production adds {resources: {tool_runner_host: 1}}.",
    )


class TimeoutOptions(_Strict):
    first_event_s: float = Field(
        default=120.0, gt=0, description="Wait for a head's first event before a 504."
    )
    idle_s: float = Field(default=60.0, gt=0, description="Longest gap between stream events.")


class ImageOptions(_Strict):
    max_bytes: int = Field(default=8 * 1024 * 1024, ge=1, description="Per image.")
    max_fetched_urls: int = Field(default=8, ge=0, description="Remote image URLs per request.")
    fetch_timeout_s: float = Field(default=10.0, gt=0, description="Per remote image.")
    allow_private_hosts: bool = Field(
        default=False, description="Allow fetching from private/loopback addresses (tests only)."
    )


class DocumentOptions(_Strict):
    """Detect and parse routes (docs/reference/documents.md)."""

    detect_timeout_s: float = Field(
        default=120.0, gt=0, description="Wait for a detect head's regions before a 504."
    )
    parse_timeout_s: float = Field(
        default=300.0, gt=0, description="Wait for a parse head's result before a 504."
    )
    default_max_new_tokens: int = Field(
        default=512, ge=1, description="max_new_tokens bound of parse models without one."
    )
    max_image_pixels: int = Field(
        default=40_000_000,
        ge=1,
        le=178_956_970,
        description="Largest image (width x height); larger is 400 invalid_image before it "
        "is decoded (a few KB of PNG can declare gigapixels). At most Pillow's own bomb limit.",
    )


class EmbeddingOptions(_Strict):
    """Embeddings, rerank and score routes (docs/api.md, "Embeddings, rerank and score")."""

    max_inputs: int = Field(
        default=2048,
        ge=1,
        description="Inputs of one /v1/embeddings request, documents of one rerank, texts of "
        "one side of a score (OpenAI's bound: 2,048); 400 above.",
    )
    timeout_s: float = Field(
        default=120.0, gt=0, description="Wait for a pooling head's answer before a 504."
    )


class ResponsesOptions(_Strict):
    """``POST /v1/responses`` (docs/reference/responses.md#request)."""

    structured_text_formats: bool = Field(
        default=False,
        description="Accept text.format json_schema and json_object and decode them with a "
        "grammar on models that honour structured outputs (an extension agent frameworks "
        "use for typed outputs). Off, as the contract says: only text, any other format 400.",
    )


class AudioOptions(_Strict):
    """Speech and transcription routes (docs/reference/audio.md,
    docs/reference/common.md#limits)."""

    speech_timeout_s: float = Field(
        default=300.0, gt=0, description="Wait for a speech head's WAV before a 504."
    )
    transcription_timeout_s: float = Field(
        default=300.0, gt=0, description="Wait for a transcription head's text before a 504."
    )
    max_file_bytes: int = Field(
        default=25 * 1024 * 1024,
        ge=1,
        description="Largest transcription file (the API's 25 MB, read as 25 MiB); 413 above.",
    )
    multipart_overhead_bytes: int = Field(
        default=1024 * 1024,
        ge=0,
        description="Body allowance beyond max_file_bytes for multipart framing and fields.",
    )
    max_audio_seconds: float = Field(
        default=4 * 3600.0,
        gt=0,
        description="Longest decoded upload a transcription head accepts (a small "
        "compressed file can expand to hours of samples).",
    )


class VideoOptions(_Strict):
    """Asynchronous video jobs (docs/reference/video.md, docs/reference/common.md#limits): caps,
    worker pacing, reconciliation.

    The same values reach the gateway (cap, listing, reconciliation on read) and
    every video head (its worker loop), so heartbeat and staleness agree.
    """

    max_unfinished_jobs_per_user: int = Field(
        default=2, ge=1, description="Queued + running jobs per user; the API says 2 (429 above)."
    )
    list_limit: int = Field(default=20, ge=1, le=100, description="Jobs returned by the list.")
    quota_retry_after_s: int = Field(
        default=30, ge=1, description="Retry-After of a video_jobs_quota_exceeded 429."
    )
    poll_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="How often an idle worker looks for queued jobs (a create also wakes it).",
    )
    heartbeat_interval_s: float = Field(
        default=2.0, gt=0, description="How often a worker refreshes its running job's heartbeat."
    )
    stale_after_s: float = Field(
        default=60.0,
        gt=0,
        description="A running job whose heartbeat is older is failed (its worker died).",
    )
    unclaimed_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="A queued job older than this is failed when its head is not ready.",
    )

    @model_validator(mode="after")
    def _heartbeat_below_staleness(self) -> VideoOptions:
        if self.heartbeat_interval_s * 3 > self.stale_after_s:
            raise ValueError("stale_after_s must be at least 3 x heartbeat_interval_s")
        return self


class BatchOptions(_Strict):
    """``/v1/files`` and ``/v1/batches`` (docs/api.md, "Files" and "Batches"): bounds,
    price, the per-organization limit, and the worker that runs lines on idle capacity."""

    enabled: bool = Field(default=True, description="Run batch lines in the gateway replicas.")
    discount: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A batch line costs the catalog's price times this factor.",
    )
    max_file_bytes: int = Field(
        default=200 * 1000 * 1000, ge=1, description="Largest upload to /v1/files (413 above)."
    )
    max_lines: int = Field(
        default=50_000, ge=1, description="Most requests in one batch input file."
    )
    max_enqueued_tokens_per_org: int | None = Field(
        default=20_000_000,
        ge=1,
        description="Estimated tokens of an organization's unfinished batches (validating, "
        "in progress, finalizing, cancelling); a batch that would exceed it fails validation "
        "with token_limit_exceeded. None: no limit.",
    )
    concurrency: int = Field(
        default=2, ge=1, description="Lines one replica's worker runs at once."
    )
    yield_to_live: bool = Field(
        default=True,
        description="Start no new line while a live request of the replica is in flight, "
        "nor within live_quiet_s after one ended.",
    )
    live_quiet_s: float = Field(
        default=1.0,
        ge=0,
        description="With yield_to_live: how long after a live request ends before new lines "
        "start (a client's next call often follows within it).",
    )
    lease_s: float = Field(
        default=60.0,
        gt=0,
        description="A claimed line (or batch stage) is re-claimed this long after its "
        "worker's last heartbeat: a killed worker's work resumes after at most this.",
    )
    poll_interval_s: float = Field(
        default=1.0, gt=0, description="How often an idle worker looks for work."
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        description="Claims of one line before it fails (a line that kills "
        "its worker every time must not stall the batch).",
    )
    max_line_result_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Largest answer one line may have (its body's JSON bytes): a line over "
        "it fails with result_too_large and is not billed, so no line's result can exhaust "
        "a replica's memory when it is run, stored or finalized.",
    )
    completion_window_s: float = Field(
        default=24 * 3600.0, gt=0, description="The 24h window; unfinished lines then expire."
    )
    files_list_limit: int = Field(
        default=10_000, ge=1, description="Default page size of GET /v1/files."
    )


class StorageQuotaOptions(_Strict):
    """Per-organization bounds on what it stores (docs/api.md, "Tenant isolation"): its files
    (uploads and batch outputs) and its adapters. An upload past either is refused with 403
    ``storage_quota_exceeded``; a batch's output is written regardless and counts after."""

    max_bytes_per_org: int | None = Field(
        default=10 * 1000**3,
        ge=1,
        description="Bytes an organization may store in files and adapters; None: no bound.",
    )
    max_objects_per_org: int | None = Field(
        default=10_000,
        ge=1,
        description="Files (uploads and batch outputs) plus adapters an organization may "
        "hold; None: no bound.",
    )


class LimitsOptions(_Strict):
    """Platform-wide rate limits (docs/reference/common.md#limits): defaults for users without their
    own values.

    Keys and users carry their own RPM/TPM/daily values in the database
    (``gateway keys create --rpm``, ``gateway users update``); these apply to a
    user who has none. ``None`` everywhere (the default) means unlimited.
    """

    rpm: int | None = Field(
        default=None, ge=1, description="Default requests per minute per user; None: unlimited."
    )
    tpm: int | None = Field(
        default=None, ge=1, description="Default tokens per minute per user; None: unlimited."
    )
    daily_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Default daily token quota per user (resets at midnight UTC); None: none.",
    )
    window_s: float = Field(
        default=60.0,
        gt=0,
        description="Sliding window of rpm/tpm in seconds; the API's minute. Change only "
        "for benchmarks.",
    )
    redis_prefix: str = Field(
        default="gw",
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Prefix of every counter key in Redis (GATEWAY_REDIS_URL); lets "
        "deployments share one Redis.",
    )
    fail_open: bool = Field(
        default=True,
        description="When the counter store is unreachable: serve without limits (true, "
        "logged and counted in gateway_limits_fail_open) or answer 503 (false). Unset in a "
        "production deployment_mode config: false (a Redis outage must not switch limits off).",
    )


class LedgerOptions(_Strict):
    """The usage ledger: a local spool flushed in batches to the SQL database."""

    enabled: bool = Field(default=True, description="Record usage (one row per request).")
    spool_dir: str | None = Field(
        default=None,
        description="Folder of the durable spool; default <GATEWAY_STATE_DIR>/ledger-spool. "
        "Must be local disk that survives a replica restart.",
    )
    flush_interval_s: float = Field(
        default=1.0, gt=0, description="How often spooled records are committed to SQL."
    )
    batch_size: int = Field(
        default=500, ge=1, description="Records that trigger a flush before the interval."
    )
    fsync: bool = Field(
        default=False,
        description="fsync each record: also survives a machine crash, at disk latency per "
        "request (a flushed write already survives a process crash).",
    )


DeploymentMode = Literal["local", "production"]


class GatewayAppArgs(_Strict):
    """Everything ``build_gateway_app`` needs; mirrors the ``args:`` block."""

    deployment_mode: DeploymentMode = Field(
        default="local",
        description="production: the gateway refuses to start on the one-machine defaults "
        "(SQLite, in-process counters and replay cache, local object store) and limits fail "
        "closed unless limits.fail_open says otherwise (serve_app.settings.production_refusals).",
    )

    catalog: list[CatalogModel] = Field(default_factory=list, description="Models declared inline.")
    catalog_files: list[str] = Field(
        default_factory=list,
        description="YAML files with a `models:` list; relative paths are from the repo root.",
    )
    ingress: IngressOptions = Field(default_factory=IngressOptions)
    timeouts: TimeoutOptions = Field(default_factory=TimeoutOptions)
    images: ImageOptions = Field(default_factory=ImageOptions)
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1024, description="Default request body limit (413 above)."
    )
    readiness_refresh_s: float = Field(
        default=2.0, gt=0, description="How often each gateway replica reads Serve's status."
    )
    audio: AudioOptions = Field(
        default_factory=AudioOptions, description="Speech and transcription routes."
    )
    documents: DocumentOptions = Field(
        default_factory=DocumentOptions, description="Detect and parse routes."
    )
    video: VideoOptions = Field(
        default_factory=VideoOptions, description="Asynchronous video generation jobs."
    )
    embeddings: EmbeddingOptions = Field(
        default_factory=EmbeddingOptions, description="Embeddings, rerank and score routes."
    )
    responses: ResponsesOptions = Field(
        default_factory=ResponsesOptions, description="The /v1/responses route."
    )
    tools: ToolsOptions = Field(
        default_factory=ToolsOptions,
        description="Server tools: search provider, fetch limits, code sandbox.",
    )
    tool_runner: ToolRunnerOptions = Field(
        default_factory=ToolRunnerOptions,
        description="Where code_interpreter runs: its own deployment (default) or in-process.",
    )
    limits: LimitsOptions = Field(
        default_factory=LimitsOptions, description="Platform default rate limits and quota."
    )
    batches: BatchOptions = Field(
        default_factory=BatchOptions,
        description="Files and batches: bounds, discount, enqueued-token limit, the worker.",
    )
    storage_quota: StorageQuotaOptions = Field(
        default_factory=StorageQuotaOptions,
        description="Per-organization stored bytes and object count (files, adapters).",
    )
    ledger: LedgerOptions = Field(
        default_factory=LedgerOptions, description="Usage ledger spool and flushing."
    )
    dedicated: DedicatedOptions = Field(
        default_factory=DedicatedOptions,
        description="Dedicated endpoints: rate card, caps, presets, per-model offer.",
    )
    dashboard: DashboardOptions = Field(
        default_factory=DashboardOptions,
        description="The console's sign-in: an OpenID Connect provider besides passwords.",
    )

    @model_validator(mode="after")
    def _production_fails_closed(self) -> GatewayAppArgs:
        # Only the default flips: an explicit `fail_open: true` stays the operator's choice.
        if self.deployment_mode == "production" and "fail_open" not in self.limits.model_fields_set:
            self.limits.fail_open = False
        oidc = self.dashboard.oidc
        if self.deployment_mode == "production" and oidc is not None:
            problems = oidc.production_problems()
            if problems:
                raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _load_files(self) -> GatewayAppArgs:
        models = list(self.catalog)
        for name in self.catalog_files:
            models.extend(load_catalog_file(name))
        ids = [m.id for m in models]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate catalog ids: {', '.join(duplicates)}")
        self.catalog = models
        self.catalog_files = []
        return self


def load_catalog_file(name: str) -> list[CatalogModel]:
    path = Path(name)
    if not path.is_absolute():
        path = REPO_ROOT / path
    data = yaml.safe_load(path.read_text()) or {}
    return [CatalogModel.model_validate(entry) for entry in data.get("models", [])]
