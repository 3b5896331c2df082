"""Process-wide settings that come from the environment (secrets, URLs, paths).

Everything an operator sets per deployment but never commits lives here, read
from ``GATEWAY_*`` variables. Model and route layout live in the Serve config
(``configs/*.yaml``) and are validated by ``serve_app.builders`` instead.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_STATE_DIR = Path.home() / ".local" / "share" / "inference-gateway"


class GatewaySettings(BaseSettings):
    """Environment-driven settings shared by the gateway, its heads and the CLI."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore")

    state_dir: Path = Field(
        default=DEFAULT_STATE_DIR,
        description="Where the embedded default keeps its SQLite file, objects and models.",
    )
    database_url: str | None = Field(
        default=None,
        description=(
            "SQLAlchemy URL of the accounts/usage database. Unset: a SQLite file in "
            "state_dir. PostgreSQL: postgresql+psycopg://user@host:5432/db."
        ),
    )
    redis_url: str | None = Field(
        default=None,
        description="Redis URL for counters shared by gateway replicas; unset = in-process.",
    )
    auth_cache_seconds: float = Field(
        default=1.0,
        ge=0,
        description="How long a verified key is trusted before the database is asked again.",
    )
    key_pepper: str = Field(
        default="",
        description="Optional secret mixed into key hashes; changing it invalidates all keys.",
    )

    def resolved_database_url(self) -> str:
        """The URL to connect to, creating the SQLite folder when that is the default."""
        if self.database_url:
            return self.database_url
        self.state_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.state_dir / 'gateway.db').resolve()}"


@lru_cache(maxsize=1)
def get_settings() -> GatewaySettings:
    """Settings read once per process."""
    return GatewaySettings()
