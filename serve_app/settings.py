"""Process-wide settings that come from the environment (secrets, URLs, paths).

Everything an operator sets per deployment but never commits lives here, read
from ``GATEWAY_*`` variables. Model and route layout live in the Serve config
(``configs/*.yaml``) and are validated by ``serve_app.builders`` instead.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from serve_app.contract.paths import DEFAULT_STATE_DIR

STACK_RESERVE_GIB = 1.7
"""What the embedded stack holds beside its heads, measured (docs/deployment.md, "Memory
budget"): machine used 4.14 GiB idle with SmolLM2's head at 2.42 GiB PSS, the rest Ray
(0.77), the gateway replica, tool runner and driver (0.38) and the kernel's share of them."""


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
        default=60.0,
        ge=0,
        description=(
            "How long a verified key is trusted before the database is asked again. Changes "
            "made through the gateway or its CLI drop the cache at once on every replica "
            "(the accounts generation); this bounds only edits made to the database by hand."
        ),
    )
    session_ttl_s: int = Field(
        default=43_200,
        ge=60,
        description="Lifetime of a dashboard session from sign-in (default 12 h).",
    )
    login_link_ttl_s: int = Field(
        default=900,
        ge=30,
        le=86_400,
        description="Lifetime of a one-time sign-in link (`gateway users login-link`).",
    )
    key_pepper: str = Field(
        default="",
        description="Optional secret mixed into key hashes; changing it invalidates all keys.",
    )
    models_dir: Path | None = Field(
        default=None,
        description="Cache of models built from PyPI packages (prepared SmolLM2, tiny "
        "document/video models); default state_dir/models. Separate so several state "
        "folders (tests, benchmarks) share one cache instead of converting again.",
    )
    # ---- object storage (generated videos; serve_app.storage.objects) ----
    object_store: Literal["local", "s3"] = Field(
        default="local",
        description="local: files under objects_dir, served and signed by the gateway itself "
        "(one machine); s3: an S3-compatible bucket through boto3 with presigned URLs.",
    )
    objects_dir: Path | None = Field(
        default=None, description="Folder of the local object store; default state_dir/objects."
    )
    object_url_secret: str = Field(
        default="",
        description="HMAC key signing local object URLs; empty: a random key generated once "
        "into objects_dir/.url-secret (shared by the processes of this machine).",
    )
    object_url_expiry_s: int = Field(
        default=3600,
        ge=1,
        le=604_800,
        description="Lifetime of a video URL (local signature or S3 presigned; SigV4 max 7 d).",
    )
    public_base_url: str | None = Field(
        default=None,
        description="Base of local object URLs (e.g. https://api.example.com); unset: the "
        "scheme and host the request came in on.",
    )
    s3_bucket: str | None = Field(default=None, description="Bucket for object_store=s3.")
    s3_prefix: str = Field(default="", description="Key prefix inside the bucket, e.g. gw/.")
    s3_endpoint_url: str | None = Field(
        default=None,
        description="S3-compatible endpoint (MinIO, moto); unset: AWS (or AWS_ENDPOINT_URL_S3).",
    )
    s3_region: str | None = Field(
        default=None, description="Region; unset: boto3's default chain (AWS_REGION)."
    )
    s3_access_key_id: str | None = Field(
        default=None, description="Unset: boto3's default chain (env, instance profile)."
    )
    s3_secret_access_key: str | None = Field(default=None, description="Pairs with the key id.")
    s3_addressing_style: Literal["auto", "path", "virtual"] = Field(
        default="auto", description="path for most self-hosted S3 servers."
    )

    memory_budget: float | None = Field(
        default=None,
        gt=0,
        description="GiB the catalog's heads may hold awake at once (`8G`, `12GiB`, `8192M` "
        "or a number of GiB); unset: half the machine's memory less the stack's own share "
        f"({STACK_RESERVE_GIB:g} GiB: Ray, gateway replicas, tool runner). Waking a head "
        "past it first "
        "puts the least recently used idle heads to sleep (docs/deployment.md, 'Memory budget').",
    )

    @field_validator("memory_budget", mode="before")
    @classmethod
    def _parse_memory(cls, value: object) -> object:
        return parse_gib(value) if isinstance(value, str) else value

    def resolved_memory_budget_gib(self) -> float:
        """The heads' budget in GiB: the setting, else half of this machine's memory less
        what the stack holds beside the heads, so the whole of ``make run`` fits the half."""
        if self.memory_budget is not None:
            return self.memory_budget
        return default_memory_budget_gib()

    def resolved_models_dir(self) -> Path:
        """Where prepared and locally built models are cached (heads find the same folder
        with ``serve_app.contract.paths.models_dir_from_environment``)."""
        return self.models_dir or self.state_dir / "models"

    def resolved_objects_dir(self) -> Path:
        """Where the local object store keeps its files."""
        return self.objects_dir or self.state_dir / "objects"

    def resolved_database_url(self) -> str:
        """The URL to connect to, creating the SQLite folder when that is the default."""
        if self.database_url:
            return self.database_url
        self.state_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.state_dir / 'gateway.db').resolve()}"


_UNITS = {"": 1.0, "G": 1.0, "GB": 1.0, "GIB": 1.0, "M": 1 / 1024, "MB": 1 / 1024}
_UNITS |= {"MIB": 1 / 1024, "T": 1024.0, "TB": 1024.0, "TIB": 1024.0}


def parse_gib(text: str) -> float:
    """``8G`` / ``12GiB`` / ``8192M`` / ``7.5`` -> GiB (binary units whatever the spelling:
    an operator writing 8G means what ``free -g`` shows)."""
    cleaned = text.strip().upper().replace(" ", "")
    number = cleaned.rstrip("GMTIB")
    unit = cleaned[len(number) :]
    if unit not in _UNITS or not number:
        raise ValueError(f"not a memory size: {text!r} (write e.g. 8G, 12GiB or 8192M)")
    return float(number) * _UNITS[unit]


def default_memory_budget_gib() -> float:
    """Half the machine less ``STACK_RESERVE_GIB`` (never below a quarter of the machine:
    on a small machine the heads keep some room and ``gateway check`` says what fits)."""
    half = machine_memory_gib() / 2
    return max(half - STACK_RESERVE_GIB, half / 2)


def machine_memory_gib() -> float:
    """This machine's physical memory in GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


class ProductionRefused(RuntimeError):
    """A production-mode gateway would run on a one-machine default; the message says which."""


def production_refusals(settings: GatewaySettings) -> list[str]:
    """Why a production deployment may not start with ``settings``: one line per gap.

    Each default below is right on one machine and silently wrong on a cluster: a SQLite
    file per node splits accounts and usage, in-process counters multiply every limit by
    the replica count (and forget Idempotency-Key answers on another replica), and a local
    object folder serves videos from one node only. Each line names the variable to set.
    """
    problems: list[str] = []
    url = settings.database_url or ""
    if not url:
        problems.append(
            "GATEWAY_DATABASE_URL is unset: production refuses the per-node SQLite file; set "
            "it to postgresql+psycopg://USER:PASSWORD@HOST:5432/DB"
        )
    elif url.startswith("sqlite"):
        problems.append(
            "GATEWAY_DATABASE_URL names SQLite: production needs a shared database; set it to "
            "postgresql+psycopg://USER:PASSWORD@HOST:5432/DB"
        )
    if not settings.redis_url:
        problems.append(
            "GATEWAY_REDIS_URL is unset: production refuses in-process rate-limit counters and "
            "Idempotency-Key replay cache (each replica would keep its own); set it to "
            "redis://HOST:6379/0"
        )
    if settings.object_store == "local":
        problems.append(
            "GATEWAY_OBJECT_STORE is local: production refuses a folder on one node for "
            "generated videos; set GATEWAY_OBJECT_STORE=s3 and GATEWAY_S3_BUCKET"
        )
    elif not settings.s3_bucket:
        problems.append(
            "GATEWAY_S3_BUCKET is unset: GATEWAY_OBJECT_STORE=s3 needs the bucket to write to"
        )
    if os.environ.get("GATEWAY_OUTBOUND_ALLOW_LOOPBACK_FOR_TESTS", "").lower() in ("1", "true"):
        problems.append(
            "GATEWAY_OUTBOUND_ALLOW_LOOPBACK_FOR_TESTS is set: it lets client-supplied URLs "
            "reach this machine's loopback services (tests only); unset it"
        )
    return problems


def require_production_ready(settings: GatewaySettings, stand_ins: Sequence[str] = ()) -> None:
    """Raise ``ProductionRefused`` listing every gap; the gateway then does not start.

    ``stand_ins``: the catalog's test engines and random-weight models, one line each
    (``serve_app.composition.stand_in_refusals``)."""
    problems = [*production_refusals(settings), *stand_ins]
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ProductionRefused(
            "deployment_mode is production but the environment has one-machine defaults or "
            f"the catalog test parts (docs/deployment.md, 'Refusals'):\n{lines}"
        )


@lru_cache(maxsize=1)
def get_settings() -> GatewaySettings:
    """Settings read once per process."""
    return GatewaySettings()
