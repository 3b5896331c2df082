"""The services a gateway needs at start: the database, Redis and the object store.

Each is reached once with a short timeout (a probe, not a use): an unreachable one
would otherwise surface as the first request's 503, minutes after the start.
"""

from __future__ import annotations

import tempfile
from typing import Any

from serve_app.cli.check.problems import Problem, first_line
from serve_app.settings import GatewaySettings

CONNECT_TIMEOUT_S = 5


def check_services(settings: GatewaySettings) -> list[Problem]:
    """The database, Redis and the object store, each reached once with a short timeout."""
    problems = [check_database(settings), check_redis(settings), check_object_store(settings)]
    return [p for p in problems if p is not None]


def check_database(settings: GatewaySettings) -> Problem | None:
    import sqlalchemy as sa

    url = settings.resolved_database_url()
    shown = sa.make_url(url).render_as_string(hide_password=True)
    connect_args = {"connect_timeout": CONNECT_TIMEOUT_S} if url.startswith("postgres") else {}
    try:
        engine = sa.create_engine(url, connect_args=connect_args)
        try:
            with engine.connect() as connection:
                connection.exec_driver_sql("SELECT 1")
        finally:
            engine.dispose()
    except Exception as exc:
        cause = getattr(exc, "orig", None) or exc
        return Problem(
            "database",
            f"{shown} is unreachable ({first_line(cause)})",
            "start the database or correct GATEWAY_DATABASE_URL",
        )
    return None


def check_redis(settings: GatewaySettings) -> Problem | None:
    if not settings.redis_url:
        return None
    import redis

    client = redis.Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=CONNECT_TIMEOUT_S,
    )
    try:
        client.ping()
    except Exception as exc:
        return Problem(
            "redis",
            f"{_redacted(settings.redis_url)} is unreachable ({first_line(exc)})",
            "start Redis or correct GATEWAY_REDIS_URL",
        )
    finally:
        client.close()
    return None


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url


def check_object_store(settings: GatewaySettings) -> Problem | None:
    if settings.object_store == "local":
        folder = settings.resolved_objects_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".check-"):
                pass
        except OSError as exc:
            return Problem(
                "object store",
                f"local folder {folder} is not writable ({exc})",
                "fix its permissions or set GATEWAY_OBJECTS_DIR",
            )
        return None
    if not settings.s3_bucket:
        return Problem(
            "object store", "GATEWAY_OBJECT_STORE=s3 without a bucket", "set GATEWAY_S3_BUCKET"
        )
    try:
        _s3_probe_client(settings).head_bucket(Bucket=settings.s3_bucket)
    except Exception as exc:
        return Problem(
            "object store",
            f"S3 bucket {settings.s3_bucket} is unreachable ({first_line(exc)})",
            "check GATEWAY_S3_BUCKET, GATEWAY_S3_ENDPOINT_URL and the AWS credentials",
        )
    return None


def _s3_probe_client(settings: GatewaySettings) -> Any:
    """The gateway's S3 client with a short timeout and no retries (a probe, not a put)."""
    from serve_app.storage.objects import s3_client

    return s3_client(
        settings,
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=CONNECT_TIMEOUT_S,
        retries={"max_attempts": 1},
    )
