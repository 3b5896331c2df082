"""The stand-in external provider of ``make run``: the gateway's own ``/v1`` on loopback.

External models (docs/reference/models.md#model-card ``routing``, the 403
``external_providers_disabled`` rule, ``pricing.mode: external``) need an OpenAI-compatible upstream
and a key for it. These machines reach no real provider, so the local catalog declares
``loopback/smollm2-135m-instruct``: an external model whose upstream is this
very gateway, calling its own ``smollm2-135m-instruct``. Every external code
path (upstream request translation, SSE relay, upstream error mapping, the
org switch, external pricing) then runs for real on a fresh machine.

``gateway run`` calls ``prepare_loopback_provider`` before Ray starts, so the
replicas inherit the two variables the catalog entry names. The key belongs
to the ``loopback-provider`` user and org: like a real provider's invoice, the
upstream call is metered to that account, and the caller is billed at the
model's external price. The raw key is kept (mode 0600) in the state folder and
reused while it is still active, so restarts do not mint a key each time.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from serve_app.auth.accounts import AccountStore
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database

logger = logging.getLogger(__name__)

LOOPBACK_ACCOUNT = "loopback-provider"
"""User and org that own the loopback provider's key (and are billed its calls)."""
KEY_ENV = "GATEWAY_LOOPBACK_API_KEY"
"""Named by ``external.api_key_env`` of the loopback catalog entry."""
BASE_URL_ENV = "GATEWAY_LOOPBACK_BASE_URL"
"""Named by ``external.base_url_env``: follows ``--port`` / ``GATEWAY_PORT``."""
KEY_FILE = "loopback-provider.key"


def loopback_base_url(host: str, port: int) -> str:
    """The upstream URL: loopback even when the gateway listens on all interfaces."""
    reachable = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{reachable}:{port}/v1"


def ensure_loopback_key(settings: GatewaySettings) -> str:
    """The stored loopback key when it is still active, else a newly minted one."""
    path = settings.state_dir / KEY_FILE
    db = Database.from_settings(settings)
    try:
        db.migrate()
        store = AccountStore(db, pepper=settings.key_pepper)
        stored = _read_key(path)
        if stored and store.principal_for_hash(store.hash(stored)) is not None:
            return stored
        raw = store.create_key(LOOPBACK_ACCOUNT, LOOPBACK_ACCOUNT)
    finally:
        db.dispose()
    _write_key(path, raw)
    logger.info("minted the loopback provider's key (kept in %s)", path)
    return raw


def prepare_loopback_provider(settings: GatewaySettings, host: str, port: int) -> None:
    """Export the loopback provider's key and URL unless the caller already set them."""
    if not os.environ.get(KEY_ENV):
        os.environ[KEY_ENV] = ensure_loopback_key(settings)
    os.environ.setdefault(BASE_URL_ENV, loopback_base_url(host, port))


def _read_key(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def _write_key(path: Path, raw: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(raw + "\n")
    os.replace(tmp, path)
