"""The current shape of every table, as SQLAlchemy Core ``Table`` objects.

Queries import their tables from here. Migrations do not: a migration records
history, and history must not change when a column is added here later (see
``serve_app.storage.migrations``). A unit test reflects a migrated database and
checks it matches this module, so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

metadata = sa.MetaData()


def utcnow() -> datetime:
    """Timestamps are stored in UTC so SQLite and PostgreSQL agree on them."""
    return datetime.now(UTC)


# Bootstrap table of the migration runner; its shape must never change.
schema_migrations = sa.Table(
    "schema_migrations",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
)

orgs = sa.Table(
    "orgs",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("external_providers_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("internal", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    # Added by migration "dashboard_sessions": tools an org admin switches on for every member
    # (a member has a tool when their user flag or their org's flag is on).
    sa.Column("web_search_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("web_fetch_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("code_interpreter_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
)

users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    # NULL limits mean "the platform default governs" (UserLimits).
    sa.Column("rpm", sa.Integer, nullable=True),
    sa.Column("tpm", sa.Integer, nullable=True),
    sa.Column("daily_tokens", sa.BigInteger, nullable=True),
    sa.Column("web_search_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("web_fetch_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("code_interpreter_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    # Added by migration "dashboard_sessions": the argon2 hash of a dashboard password.
    sa.Column("password_hash", sa.Text, nullable=True),
)

memberships = sa.Table(
    "memberships",
    metadata,
    sa.Column("user_id", sa.Text, sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("org_id", sa.Text, sa.ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.CheckConstraint("role IN ('member', 'admin')", name="ck_memberships_role"),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    # Only the peppered HMAC of a key is stored; the raw key is shown once.
    sa.Column("key_hash", sa.Text, nullable=False),
    # First characters after the vendor prefix, so a listing can tell keys apart.
    sa.Column("display_prefix", sa.Text, nullable=False),
    sa.Column("user_id", sa.Text, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("org_id", sa.Text, sa.ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("scopes", sa.Text, nullable=False),  # space-separated scope names
    sa.Column("rpm", sa.Integer, nullable=True),
    sa.Column("tpm", sa.Integer, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    # Added by migration "dashboard_sessions": a name, an optional expiry, the last use
    # (refreshed at most once a minute per key and replica: when the auth cache misses).
    sa.Column("name", sa.Text, nullable=True),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
    sa.Index("ix_api_keys_key_hash", "key_hash", unique=True),
    sa.Index("ix_api_keys_user_id", "user_id"),
)

# Dashboard sessions (serve_app.auth.sessions): only the SHA-256 of the cookie's token is
# stored, so a leaked table opens no session. Every replica reads the row on every request:
# a sign-out, a password change or a member's removal ends the session everywhere at once.
dashboard_sessions = sa.Table(
    "dashboard_sessions",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("token_hash", sa.Text, nullable=False),
    sa.Column("user_id", sa.Text, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("org_id", sa.Text, sa.ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("csrf_token", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    # Set at sign-out, password change, removal: the row stays while batches it made run.
    sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
    sa.Index("ix_dashboard_sessions_token", "token_hash", unique=True),
    sa.Index("ix_dashboard_sessions_user", "user_id"),
)

# One-time sign-in links printed by `gateway users login-link` (hashed, single use, short).
login_tokens = sa.Table(
    "login_tokens",
    metadata,
    sa.Column("token_hash", sa.Text, primary_key=True),
    sa.Column("user_id", sa.Text, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("org_id", sa.Text, sa.ForeignKey("orgs.id", ondelete="CASCADE"), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
)

# One row per billed request (serve_app.billing). request_id is the idempotency
# key: the ledger inserts with "on conflict do nothing", so replays never bill twice.
usage_records = sa.Table(
    "usage_records",
    metadata,
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("user_id", sa.Text, nullable=False),
    sa.Column("key_id", sa.Text, nullable=False),
    sa.Column("org_id", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("route", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
    sa.Column("completion_tokens", sa.BigInteger, nullable=False),
    sa.Column("cached_tokens", sa.BigInteger, nullable=True),
    sa.Column("reasoning_tokens", sa.BigInteger, nullable=True),
    sa.Column("requests", sa.Integer, nullable=False),
    sa.Column("web_searches", sa.Integer, nullable=False),
    sa.Column("code_seconds", sa.Float, nullable=False),
    sa.Column("images", sa.Integer, nullable=False),
    sa.Column("audio_seconds", sa.Float, nullable=False),
    # The price in force when the request ran, copied so history never changes.
    sa.Column("currency", sa.Text, nullable=False),
    sa.Column("pricing_mode", sa.Text, nullable=False),
    sa.Column("input_per_mtok", sa.Float, nullable=False),
    sa.Column("output_per_mtok", sa.Float, nullable=False),
    sa.Column("per_image", sa.Float, nullable=True),
    sa.Column("per_audio_second", sa.Float, nullable=True),
    sa.Column("spot_multiplier", sa.Float, nullable=True),
    sa.Column("cost", sa.Float, nullable=False),
    # Added by migration 4 (video jobs): seconds of generated video and their unit price.
    sa.Column("video_seconds", sa.Float, nullable=False, server_default=sa.text("0")),
    sa.Column("per_video_second", sa.Float, nullable=True),
    # Added by migration 7 (batches): the batch a record was run for, and its discount.
    sa.Column("batch_id", sa.Text, nullable=True),
    sa.Column("batch_discount", sa.Float, nullable=True),
    sa.CheckConstraint("status IN ('ok', 'partial', 'aborted')", name="ck_usage_records_status"),
    sa.Index("ix_usage_records_user_created", "user_id", "created_at"),
)

# Dedicated endpoints (serve_app.dedicated). Rows are never removed: a deleted endpoint keeps
# its alias (never reused) and its billing history. ``revision`` grows with every API change;
# the reconciler's state transitions are conditional on it, so they never undo a newer change.
dedicated_endpoints = sa.Table(
    "dedicated_endpoints",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("org_id", sa.Text, nullable=False),
    sa.Column("created_by", sa.Text, nullable=False),
    sa.Column("model_id", sa.Text, nullable=False),
    sa.Column("slug", sa.Text, nullable=False),
    sa.Column("mode", sa.Text, nullable=False),
    sa.Column("lifecycle", sa.Text, nullable=False),
    sa.Column("gpu_type", sa.Text, nullable=False),
    sa.Column("alias", sa.Text, nullable=False, unique=True),
    sa.Column("min_replicas", sa.Integer, nullable=False),
    sa.Column("max_replicas", sa.Integer, nullable=False),
    sa.Column("reserved_floor", sa.Integer, nullable=False),
    sa.Column("cards_per_replica", sa.Integer, nullable=False),
    sa.Column("revision", sa.Integer, nullable=False),
    sa.Column("deploy_version", sa.Integer, nullable=False),
    sa.Column("rolled_back", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("pending", sa.Text, nullable=True),  # provision | mode | engine | resume | rollback
    sa.Column("scaling", sa.Text, nullable=True),  # JSON DedicatedScalingPolicy
    sa.Column("engine", sa.Text, nullable=True),  # JSON DedicatedEngineConfig
    sa.Column("previous", sa.Text, nullable=True),  # JSON {mode, reserved_floor, engine}
    sa.Column("previous_mode", sa.Text, nullable=True),
    sa.Column("deployed_hash", sa.Text, nullable=True),  # AppSpec fingerprint now in Serve
    sa.Column("live", sa.Text, nullable=True),  # JSON observation of Serve's state
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("block_tokens", sa.Integer, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("pending_since", sa.DateTime(timezone=True), nullable=True),
    sa.Column("mode_changed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("engine_changed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("deployed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("observed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Index("ix_dedicated_endpoints_org", "org_id"),
)

# One row per replica life, opened when Serve reports it placed and closed when it is gone:
# the billed minutes (docs/reference/dedicated.md: boot included, until release).
dedicated_replicas = sa.Table(
    "dedicated_replicas",
    metadata,
    sa.Column("endpoint_id", sa.Text, primary_key=True),
    sa.Column("replica_id", sa.Text, primary_key=True),
    sa.Column("deployment", sa.Text, nullable=False),
    sa.Column("capacity_class", sa.Text, nullable=False),
    sa.Column("gpu_type", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("cards", sa.Integer, nullable=False),
    sa.Column("scaled_up_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("drain_requested_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("scaled_down_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("error_code", sa.Text, nullable=True),
    sa.Index("ix_dedicated_replicas_endpoint_up", "endpoint_id", "scaled_up_at"),
)

# One row per call through a ded/<slug> alias, measured at the gateway (telemetry).
dedicated_requests = sa.Table(
    "dedicated_requests",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("endpoint_id", sa.Text, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),  # ok | incomplete | error
    sa.Column("replica_id", sa.Text, nullable=True),
    sa.Column("woke", sa.Boolean, nullable=False),
    sa.Column("ttft_ms", sa.Integer, nullable=True),
    sa.Column("latency_ms", sa.Integer, nullable=True),
    sa.Column("cold_wait_ms", sa.Integer, nullable=True),
    sa.Column("cached_tokens", sa.Integer, nullable=True),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("completion_tokens", sa.Integer, nullable=False),
    sa.Index("ix_dedicated_requests_endpoint_at", "endpoint_id", "at"),
)

# Single-flight of the reconciler across gateway replicas.
dedicated_leases = sa.Table(
    "dedicated_leases",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
)

# Asynchronous video generation jobs (serve_app.jobs). The gateway inserts a row (queued,
# under the per-user cap); a video head's worker claims it (running, heartbeat_at refreshed
# while it generates) and finishes it (completed with object_key, or failed). Requested
# sizes are NULL when the caller omitted them: the head fills the model's defaults.
VIDEO_JOB_STATUSES = ("queued", "running", "completed", "failed", "cancelled")
video_jobs = sa.Table(
    "video_jobs",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("user_id", sa.Text, nullable=False),
    sa.Column("key_id", sa.Text, nullable=False),
    sa.Column("org_id", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("negative_prompt", sa.Text, nullable=True),
    sa.Column("width", sa.Integer, nullable=True),
    sa.Column("height", sa.Integer, nullable=True),
    sa.Column("num_frames", sa.Integer, nullable=True),
    sa.Column("fps", sa.Integer, nullable=True),
    sa.Column("num_inference_steps", sa.Integer, nullable=True),
    sa.Column("seed", sa.BigInteger, nullable=False),
    sa.Column("pricing", sa.Text, nullable=False),  # JSON PricingConfig in force at creation
    sa.Column("worker", sa.Text, nullable=True),  # the head replica that claimed it
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("object_key", sa.Text, nullable=True),
    sa.Column("seconds", sa.Float, nullable=True),
    sa.Column("gen_seconds", sa.Float, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    # The stored MP4's size, set with object_key on completion: counted by the
    # organization's storage quota (serve_app.storage.quotas); None while there is no file.
    sa.Column("bytes", sa.BigInteger, nullable=True),
    sa.CheckConstraint(
        "status IN ('queued', 'running', 'completed', 'failed', 'cancelled')",
        name="ck_video_jobs_status",
    ),
    sa.Index("ix_video_jobs_user_created", "user_id", "created_at"),
    sa.Index("ix_video_jobs_model_status", "model", "status", "created_at"),
    sa.Index("ix_video_jobs_org", "org_id"),
)

# One row (id 1): bumped in the transaction of every account write (serve_app.auth.epoch).
auth_epoch = sa.Table(
    "auth_epoch",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("value", sa.BigInteger, nullable=False),
)

# Rate cards of dedicated endpoints as they changed: minutes are priced at the card in force
# when they accrued (serve_app.dedicated.pricing.rates.month_usage).
dedicated_rate_cards = sa.Table(
    "dedicated_rate_cards",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
    sa.Column("card", sa.Text, nullable=False),
    sa.Index("ix_dedicated_rate_cards_effective", "effective_from"),
)

# Uploaded and generated files (serve_app.files): the bytes live in the object store under
# ``object_key``; a row belongs to an organization (another org's id is a 404).
files = sa.Table(
    "files",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("org_id", sa.Text, nullable=False),
    sa.Column("user_id", sa.Text, nullable=False),
    sa.Column("purpose", sa.Text, nullable=False),
    sa.Column("filename", sa.Text, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("object_key", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_files_org_created", "org_id", "created_at"),
)

# LoRA adapters uploaded by organizations (serve_app.adapters): the files live in the object
# store under ``object_prefix``; a name is unique within its organization.
adapters = sa.Table(
    "adapters",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("org_id", sa.Text, nullable=False),
    sa.Column("user_id", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("base_model", sa.Text, nullable=False),
    sa.Column("rank", sa.Integer, nullable=False),
    sa.Column("target_modules", sa.Text, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("sha256", sa.Text, nullable=False),
    sa.Column("object_prefix", sa.Text, nullable=False),
    sa.Column("input_per_mtok", sa.Float, nullable=True),
    sa.Column("output_per_mtok", sa.Float, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.UniqueConstraint("org_id", "name", name="uq_adapters_org_name"),
)

# Batches (serve_app.batches): one row per batch; the batch-level lease (validation,
# finalization) is held by one worker at a time.
BATCH_STATUSES = (
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
)
batches = sa.Table(
    "batches",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("org_id", sa.Text, nullable=False),
    sa.Column("user_id", sa.Text, nullable=False),
    sa.Column("key_id", sa.Text, nullable=False),
    sa.Column("endpoint", sa.Text, nullable=False),
    sa.Column("input_file_id", sa.Text, nullable=False),
    sa.Column("completion_window", sa.Text, nullable=False),
    sa.Column("meta", sa.Text, nullable=True),  # JSON object: the batch's metadata
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("output_file_id", sa.Text, nullable=True),
    sa.Column("error_file_id", sa.Text, nullable=True),
    sa.Column("errors", sa.Text, nullable=True),  # JSON list of validation errors
    sa.Column("total", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column("completed", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column("failed", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column("estimated_tokens", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    sa.Column("lease_owner", sa.Text, nullable=True),
    sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    *(
        sa.Column(f"{name}_at", sa.DateTime(timezone=True), nullable=True)
        for name in (
            "in_progress",
            "finalizing",
            "completed",
            "failed",
            "expired",
            "cancelling",
            "cancelled",
        )
    ),
    sa.Index("ix_batches_org_created", "org_id", "created_at"),
    sa.Index("ix_batches_status", "status", "created_at"),
)

# One row per input line of a batch. Workers claim lines (``running`` with a lease) and
# store each result here; the output file is assembled from these rows at finalization,
# so a line is written once and none is lost whatever worker dies.
BATCH_LINE_STATUSES = ("pending", "running", "succeeded", "failed")
batch_lines = sa.Table(
    "batch_lines",
    metadata,
    sa.Column("batch_id", sa.Text, primary_key=True),
    sa.Column("line", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("custom_id", sa.Text, nullable=False),
    sa.Column("body", sa.Text, nullable=False),  # the line's request body (JSON)
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column("lease_owner", sa.Text, nullable=True),
    sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("result", sa.Text, nullable=True),  # the output line (JSON)
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    sa.UniqueConstraint("batch_id", "custom_id", name="uq_batch_lines_custom_id"),
    sa.Index("ix_batch_lines_status", "batch_id", "status"),
)
