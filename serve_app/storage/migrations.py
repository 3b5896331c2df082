"""An ordered, idempotent migration runner that is safe under concurrent starts.

Every gateway replica and every CLI call runs ``run_migrations`` on start, so
two processes often race on a fresh database. The runner therefore applies all
pending migrations inside one transaction that first takes a database-wide
lock (``pg_advisory_xact_lock`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite):
the loser waits, then sees the versions the winner recorded and does nothing.
Both databases have transactional DDL, so a failing migration leaves no half
applied schema behind.

To add a migration, write ``def _vN_what(conn: Connection) -> None`` and append
``Migration(N, "what", _vN_what)`` to ``MIGRATIONS``. Never edit or reorder one
that has shipped. A migration declares the tables it creates on its own
``MetaData`` instead of importing them from ``schema.py``: ``schema.py`` always
shows the latest shape, and replaying old history on a fresh database must
produce the same tables it produced when it first ran. After adding columns or
tables, update ``schema.py`` too; a unit test compares the two.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from serve_app.storage.schema import schema_migrations, utcnow

logger = logging.getLogger(__name__)

# Arbitrary constant shared by every process of this application; any 64-bit
# value works as long as nothing else in the database uses it.
_PG_LOCK_KEY = 7_345_118_204_661_909_111

# Execution option read by the SQLite "begin" hook in ``serve_app.storage.db``.
SQLITE_BEGIN_OPTION = "sqlite_begin"


@dataclass(frozen=True)
class Migration:
    """One step of schema history; ``apply`` runs inside the runner's transaction."""

    version: int
    name: str
    apply: Callable[[Connection], None]


def _v1_accounts(conn: Connection) -> None:
    """Orgs, users, memberships and API keys as they were first shipped."""
    md = sa.MetaData()
    _v1_orgs_and_users(md)
    _v1_memberships_and_keys(md)
    md.create_all(conn)


def _v1_orgs_and_users(md: sa.MetaData) -> None:
    """Version 1's principals, in the order they were first declared (the DDL follows it)."""
    ts = sa.DateTime(timezone=True)
    sa.Table(
        "orgs",
        md,
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column(
            "external_providers_enabled", sa.Boolean, nullable=False, server_default=sa.false()
        ),
        sa.Column("internal", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", ts, nullable=False),
    )
    sa.Table(
        "users",
        md,
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("rpm", sa.Integer, nullable=True),
        sa.Column("tpm", sa.Integer, nullable=True),
        sa.Column("daily_tokens", sa.BigInteger, nullable=True),
        sa.Column("web_search_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("web_fetch_enabled", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column(
            "code_interpreter_enabled", sa.Boolean, nullable=False, server_default=sa.false()
        ),
        sa.Column("created_at", ts, nullable=False),
    )


def _v1_memberships_and_keys(md: sa.MetaData) -> None:
    """Version 1's links from users to orgs and to their API keys (both cascade on delete)."""
    ts = sa.DateTime(timezone=True)
    sa.Table(
        "memberships",
        md,
        sa.Column(
            "user_id", sa.Text, sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column(
            "org_id", sa.Text, sa.ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("role", sa.Text, nullable=False),
        sa.CheckConstraint("role IN ('member', 'admin')", name="ck_memberships_role"),
    )
    sa.Table(
        "api_keys",
        md,
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("key_hash", sa.Text, nullable=False),
        sa.Column("display_prefix", sa.Text, nullable=False),
        sa.Column(
            "user_id", sa.Text, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("org_id", sa.Text, sa.ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("scopes", sa.Text, nullable=False),
        sa.Column("rpm", sa.Integer, nullable=True),
        sa.Column("tpm", sa.Integer, nullable=True),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("revoked_at", ts, nullable=True),
        sa.Index("ix_api_keys_key_hash", "key_hash", unique=True),
        sa.Index("ix_api_keys_user_id", "user_id"),
    )


def _v2_usage_ledger(conn: Connection) -> None:
    """The usage ledger (one row per billed request) as first shipped."""
    md = sa.MetaData()
    ts = sa.DateTime(timezone=True)
    big, num = sa.BigInteger, sa.Float
    sa.Table(
        "usage_records",
        md,
        sa.Column("request_id", sa.Text, primary_key=True),
        sa.Column("created_at", ts, nullable=False),
        *(sa.Column(name, sa.Text, nullable=False) for name in _V2_TEXT),
        sa.Column("prompt_tokens", big, nullable=False),
        sa.Column("completion_tokens", big, nullable=False),
        sa.Column("cached_tokens", big, nullable=True),
        sa.Column("reasoning_tokens", big, nullable=True),
        sa.Column("requests", sa.Integer, nullable=False),
        sa.Column("web_searches", sa.Integer, nullable=False),
        sa.Column("code_seconds", num, nullable=False),
        sa.Column("images", sa.Integer, nullable=False),
        sa.Column("audio_seconds", num, nullable=False),
        sa.Column("currency", sa.Text, nullable=False),
        sa.Column("pricing_mode", sa.Text, nullable=False),
        sa.Column("input_per_mtok", num, nullable=False),
        sa.Column("output_per_mtok", num, nullable=False),
        sa.Column("per_image", num, nullable=True),
        sa.Column("per_audio_second", num, nullable=True),
        sa.Column("spot_multiplier", num, nullable=True),
        sa.Column("cost", num, nullable=False),
        sa.CheckConstraint(
            "status IN ('ok', 'partial', 'aborted')", name="ck_usage_records_status"
        ),
        sa.Index("ix_usage_records_user_created", "user_id", "created_at"),
    )
    md.create_all(conn)


_V2_TEXT = ("user_id", "key_id", "org_id", "model", "route", "status")


def _v3_dedicated(conn: Connection) -> None:
    """Dedicated endpoints, their replicas' lifetimes, per-call telemetry, the reconciler lease."""
    md = sa.MetaData()
    ts = sa.DateTime(timezone=True)
    text, integer = sa.Text, sa.Integer
    sa.Table(
        "dedicated_endpoints",
        md,
        sa.Column("id", text, primary_key=True),
        *(sa.Column(name, text, nullable=False) for name in _V3_ENDPOINT_TEXT),
        sa.Column("alias", text, nullable=False, unique=True),
        *(sa.Column(name, integer, nullable=False) for name in _V3_ENDPOINT_INT),
        sa.Column("rolled_back", sa.Boolean, nullable=False, server_default=sa.false()),
        *(sa.Column(name, text, nullable=True) for name in _V3_ENDPOINT_OPTIONAL_TEXT),
        sa.Column("block_tokens", integer, nullable=True),
        sa.Column("created_at", ts, nullable=False),
        *(sa.Column(name, ts, nullable=True) for name in _V3_ENDPOINT_OPTIONAL_TS),
        sa.Index("ix_dedicated_endpoints_org", "org_id"),
    )
    sa.Table(
        "dedicated_replicas",
        md,
        sa.Column("endpoint_id", text, primary_key=True),
        sa.Column("replica_id", text, primary_key=True),
        *(sa.Column(name, text, nullable=False) for name in _V3_REPLICA_TEXT),
        sa.Column("version", integer, nullable=False),
        sa.Column("cards", integer, nullable=False),
        sa.Column("scaled_up_at", ts, nullable=False),
        *(sa.Column(name, ts, nullable=True) for name in _V3_REPLICA_OPTIONAL_TS),
        sa.Column("error_code", text, nullable=True),
        sa.Index("ix_dedicated_replicas_endpoint_up", "endpoint_id", "scaled_up_at"),
    )
    sa.Table(
        "dedicated_requests",
        md,
        sa.Column("id", integer, primary_key=True, autoincrement=True),
        sa.Column("endpoint_id", text, nullable=False),
        sa.Column("at", ts, nullable=False),
        sa.Column("outcome", text, nullable=False),
        sa.Column("replica_id", text, nullable=True),
        sa.Column("woke", sa.Boolean, nullable=False),
        *(sa.Column(name, integer, nullable=True) for name in _V3_REQUEST_OPTIONAL_INT),
        sa.Column("prompt_tokens", integer, nullable=False),
        sa.Column("completion_tokens", integer, nullable=False),
        sa.Index("ix_dedicated_requests_endpoint_at", "endpoint_id", "at"),
    )
    sa.Table(
        "dedicated_leases",
        md,
        sa.Column("name", text, primary_key=True),
        sa.Column("holder", text, nullable=False),
        sa.Column("expires_at", ts, nullable=False),
    )
    md.create_all(conn)


_V3_ENDPOINT_TEXT = ("org_id", "created_by", "model_id", "slug", "mode", "lifecycle", "gpu_type")
_V3_ENDPOINT_INT = (
    "min_replicas",
    "max_replicas",
    "reserved_floor",
    "cards_per_replica",
    "revision",
    "deploy_version",
)
_V3_ENDPOINT_OPTIONAL_TEXT = (
    "pending",
    "scaling",
    "engine",
    "previous",
    "previous_mode",
    "deployed_hash",
    "live",
    "last_error",
)
_V3_ENDPOINT_OPTIONAL_TS = (
    "pending_since",
    "mode_changed_at",
    "engine_changed_at",
    "deleted_at",
    "deployed_at",
    "observed_at",
)
_V3_REPLICA_TEXT = ("deployment", "capacity_class", "gpu_type", "state")
_V3_REPLICA_OPTIONAL_TS = ("ready_at", "drain_requested_at", "scaled_down_at")
_V3_REQUEST_OPTIONAL_INT = ("ttft_ms", "latency_ms", "cold_wait_ms", "cached_tokens")


def _v4_video_jobs(conn: Connection) -> None:
    """Video generation jobs, and video seconds (with their unit price) in the usage ledger."""
    md = sa.MetaData()
    ts = sa.DateTime(timezone=True)
    text, integer = sa.Text, sa.Integer
    sa.Table(
        "video_jobs",
        md,
        sa.Column("id", text, primary_key=True),
        *(sa.Column(name, text, nullable=False) for name in _V4_JOB_TEXT),
        sa.Column("negative_prompt", text, nullable=True),
        *(sa.Column(name, integer, nullable=True) for name in _V4_JOB_SIZES),
        sa.Column("seed", sa.BigInteger, nullable=False),
        sa.Column("pricing", text, nullable=False),
        *(sa.Column(name, text, nullable=True) for name in ("worker", "error", "object_key")),
        sa.Column("seconds", sa.Float, nullable=True),
        sa.Column("gen_seconds", sa.Float, nullable=True),
        sa.Column("created_at", ts, nullable=False),
        *(sa.Column(name, ts, nullable=True) for name in _V4_JOB_OPTIONAL_TS),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'completed', 'failed', 'cancelled')",
            name="ck_video_jobs_status",
        ),
        sa.Index("ix_video_jobs_user_created", "user_id", "created_at"),
        sa.Index("ix_video_jobs_model_status", "model", "status", "created_at"),
    )
    md.create_all(conn)
    conn.execute(
        sa.text("ALTER TABLE usage_records ADD COLUMN video_seconds FLOAT NOT NULL DEFAULT 0")
    )
    conn.execute(sa.text("ALTER TABLE usage_records ADD COLUMN per_video_second FLOAT"))


_V4_JOB_TEXT = ("user_id", "key_id", "org_id", "model", "status", "prompt")
_V4_JOB_SIZES = ("width", "height", "num_frames", "fps", "num_inference_steps")
_V4_JOB_OPTIONAL_TS = ("started_at", "heartbeat_at", "finished_at")


def _v5_auth_epoch(conn: Connection) -> None:
    """One counter bumped by every account write: replicas poll it to drop stale auth caches."""
    md = sa.MetaData()
    table = sa.Table(
        "auth_epoch",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("value", sa.BigInteger, nullable=False),
    )
    md.create_all(conn)
    conn.execute(sa.insert(table).values(id=1, value=0))


def _v6_dedicated_rate_cards(conn: Connection) -> None:
    """Every dedicated rate card the gateway ran with, from when it took effect."""
    md = sa.MetaData()
    sa.Table(
        "dedicated_rate_cards",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("card", sa.Text, nullable=False),
        sa.Index("ix_dedicated_rate_cards_effective", "effective_from"),
    )
    md.create_all(conn)


def _v7_batches(conn: Connection) -> None:
    """Files, batches and their lines; usage records learn which batch they belong to."""
    md = sa.MetaData()
    ts = sa.DateTime(timezone=True)
    text, integer, zero = sa.Text, sa.Integer, sa.text("0")
    sa.Table(
        "files",
        md,
        sa.Column("id", text, primary_key=True),
        *(sa.Column(name, text, nullable=False) for name in ("org_id", "user_id", "purpose")),
        sa.Column("filename", text, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("object_key", text, nullable=False),
        sa.Column("created_at", ts, nullable=False),
        sa.Index("ix_files_org_created", "org_id", "created_at"),
    )
    sa.Table(
        "batches",
        md,
        sa.Column("id", text, primary_key=True),
        *(sa.Column(name, text, nullable=False) for name in _V7_BATCH_TEXT),
        sa.Column("meta", text, nullable=True),
        sa.Column("status", text, nullable=False),
        *(sa.Column(name, text, nullable=True) for name in _V7_BATCH_OPTIONAL_TEXT),
        *(
            sa.Column(name, integer, nullable=False, server_default=zero)
            for name in ("total", "completed", "failed")
        ),
        sa.Column("estimated_tokens", sa.BigInteger, nullable=False, server_default=zero),
        sa.Column("lease_owner", text, nullable=True),
        sa.Column("lease_expires_at", ts, nullable=True),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("expires_at", ts, nullable=False),
        *(sa.Column(f"{name}_at", ts, nullable=True) for name in _V7_BATCH_TIMES),
        sa.Index("ix_batches_org_created", "org_id", "created_at"),
        sa.Index("ix_batches_status", "status", "created_at"),
    )
    sa.Table(
        "batch_lines",
        md,
        sa.Column("batch_id", text, primary_key=True),
        sa.Column("line", integer, primary_key=True, autoincrement=False),
        sa.Column("custom_id", text, nullable=False),
        sa.Column("body", text, nullable=False),
        sa.Column("status", text, nullable=False),
        sa.Column("attempts", integer, nullable=False, server_default=zero),
        sa.Column("lease_owner", text, nullable=True),
        sa.Column("lease_expires_at", ts, nullable=True),
        sa.Column("result", text, nullable=True),
        sa.Column("finished_at", ts, nullable=True),
        sa.UniqueConstraint("batch_id", "custom_id", name="uq_batch_lines_custom_id"),
        sa.Index("ix_batch_lines_status", "batch_id", "status"),
    )
    md.create_all(conn)
    conn.execute(sa.text("ALTER TABLE usage_records ADD COLUMN batch_id TEXT"))
    conn.execute(sa.text("ALTER TABLE usage_records ADD COLUMN batch_discount FLOAT"))


_V7_BATCH_TEXT = ("org_id", "user_id", "key_id", "endpoint", "input_file_id", "completion_window")
_V7_BATCH_OPTIONAL_TEXT = ("output_file_id", "error_file_id", "errors")
_V7_BATCH_TIMES = (
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
)


def _v8_adapters(conn: Connection) -> None:
    """LoRA adapters uploaded per organization (names unique within one)."""
    md = sa.MetaData()
    text = sa.Text
    sa.Table(
        "adapters",
        md,
        sa.Column("id", text, primary_key=True),
        *(sa.Column(name, text, nullable=False) for name in ("org_id", "user_id", "name")),
        sa.Column("base_model", text, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("target_modules", text, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("sha256", text, nullable=False),
        sa.Column("object_prefix", text, nullable=False),
        sa.Column("input_per_mtok", sa.Float, nullable=True),
        sa.Column("output_per_mtok", sa.Float, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("org_id", "name", name="uq_adapters_org_name"),
    )
    md.create_all(conn)


def _v9_dashboard_sessions(conn: Connection) -> None:
    """Dashboard sign-in: passwords, sessions, one-time links; named keys with an expiry;
    the tool switches an org admin turns on for every member."""
    md = sa.MetaData()
    ts = sa.DateTime(timezone=True)
    text = sa.Text

    def owner(table: str, nullable: bool = False) -> sa.Column[str]:
        target = sa.ForeignKey(f"{table}s.id", ondelete="CASCADE")
        return sa.Column(f"{table}_id", text, target, nullable=nullable)

    # Reflected stand-ins so the foreign keys resolve inside this migration's metadata.
    sa.Table("users", md, sa.Column("id", text, primary_key=True))
    sa.Table("orgs", md, sa.Column("id", text, primary_key=True))
    sa.Table(
        "dashboard_sessions",
        md,
        sa.Column("id", text, primary_key=True),
        sa.Column("token_hash", text, nullable=False),
        owner("user"),
        owner("org"),
        sa.Column("csrf_token", text, nullable=False),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("expires_at", ts, nullable=False),
        sa.Column("ended_at", ts, nullable=True),
        sa.Index("ix_dashboard_sessions_token", "token_hash", unique=True),
        sa.Index("ix_dashboard_sessions_user", "user_id"),
    )
    sa.Table(
        "login_tokens",
        md,
        sa.Column("token_hash", text, primary_key=True),
        owner("user"),
        owner("org", nullable=True),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("expires_at", ts, nullable=False),
        sa.Column("used_at", ts, nullable=True),
    )
    md.create_all(conn, tables=[md.tables["dashboard_sessions"], md.tables["login_tokens"]])
    timestamp = "TIMESTAMP WITH TIME ZONE" if conn.dialect.name == "postgresql" else "DATETIME"
    for column in ("name TEXT", f"expires_at {timestamp}", f"last_used_at {timestamp}"):
        conn.execute(sa.text(f"ALTER TABLE api_keys ADD COLUMN {column}"))
    conn.execute(sa.text("ALTER TABLE users ADD COLUMN password_hash TEXT"))
    for flag in ("web_search_enabled", "web_fetch_enabled", "code_interpreter_enabled"):
        conn.execute(sa.text(f"ALTER TABLE orgs ADD COLUMN {flag} BOOLEAN NOT NULL DEFAULT false"))


def _v10_video_bytes(conn: Connection) -> None:
    """A completed video job's stored size, so its MP4 counts in its organization's storage
    quota (jobs completed before it have none and are not counted)."""
    conn.execute(sa.text("ALTER TABLE video_jobs ADD COLUMN bytes BIGINT"))
    conn.execute(sa.text("CREATE INDEX ix_video_jobs_org ON video_jobs (org_id)"))


# ---- The ordered history. Append new migrations at the end. ----------------
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "accounts", _v1_accounts),
    Migration(2, "usage_ledger", _v2_usage_ledger),
    Migration(3, "dedicated_endpoints", _v3_dedicated),
    Migration(4, "video_jobs", _v4_video_jobs),
    Migration(5, "auth_epoch", _v5_auth_epoch),
    Migration(6, "dedicated_rate_cards", _v6_dedicated_rate_cards),
    Migration(7, "batches", _v7_batches),
    Migration(8, "adapters", _v8_adapters),
    Migration(9, "dashboard_sessions", _v9_dashboard_sessions),
    Migration(10, "video_bytes", _v10_video_bytes),
)


def _check_history(migrations: Sequence[Migration]) -> None:
    versions = [m.version for m in migrations]
    if versions != sorted(set(versions)) or (versions and versions[0] < 1):
        raise ValueError(f"migration versions must be unique, positive and ascending: {versions}")


def _lock(conn: Connection) -> None:
    """Serialise concurrent runners; SQLite already holds its lock via BEGIN IMMEDIATE."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_LOCK_KEY)))


def applied_versions(conn: Connection) -> set[int]:
    """Versions recorded in ``schema_migrations`` (empty on a fresh database)."""
    if not sa.inspect(conn).has_table(schema_migrations.name):
        return set()
    return set(conn.execute(sa.select(schema_migrations.c.version)).scalars())


def run_migrations(engine: Engine, migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
    """Apply every migration not yet recorded; return the versions applied now."""
    _check_history(migrations)
    newly_applied: list[int] = []
    with engine.connect() as conn:
        conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        with conn.begin():
            _lock(conn)
            schema_migrations.create(conn, checkfirst=True)
            done = applied_versions(conn)
            for migration in migrations:
                if migration.version in done:
                    continue
                logger.info("applying migration %d (%s)", migration.version, migration.name)
                migration.apply(conn)
                conn.execute(
                    sa.insert(schema_migrations).values(
                        version=migration.version, name=migration.name, applied_at=utcnow()
                    )
                )
                newly_applied.append(migration.version)
            unknown = done - {m.version for m in migrations}
            if unknown:
                logger.warning(
                    "database has migrations this code does not know: %s", sorted(unknown)
                )
    return newly_applied
