"""Everything a request handler needs, built once per gateway replica.

Routes receive this through typed dependencies (``serve_app.requests.deps``)
instead of importing globals, so the same app runs under Ray Serve and in a
plain ``TestClient`` with in-process heads.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

from serve_app.adapters.service import AdapterService
from serve_app.auth.dashboard import DashboardSessions
from serve_app.auth.key_admin import KeyAdmin
from serve_app.auth.members import MemberAdmin
from serve_app.auth.principal import Principal
from serve_app.batches.service import BatchService
from serve_app.batches.worker import BatchWorker
from serve_app.billing.reports import UsageReports
from serve_app.catalog.catalog import Catalog
from serve_app.dedicated.api.facade import Dedicated
from serve_app.files.service import FileService
from serve_app.inference.audio.service import AudioService
from serve_app.inference.chat.service import TextService
from serve_app.inference.chat.tools import ToolChatService
from serve_app.inference.documents.service import DocumentService
from serve_app.inference.embeddings.service import EmbeddingService
from serve_app.inference.messages.service import MessagesService
from serve_app.inference.responses.service import ResponsesService
from serve_app.inference.video.service import VideoService
from serve_app.limits.limiter import PlatformLimits
from serve_app.requests.replays import ReplayStore


class Authenticator(Protocol):
    """Turns an ``Authorization`` header into a caller, or raises a 401."""

    def authenticate(self, authorization: str | None) -> Principal: ...

    def cached(self, authorization: str | None) -> Principal | None: ...

    async def refresh(self) -> None:
        """Drop cached callers when accounts changed (revocations on other replicas)."""
        ...

    async def accounts_generation(self) -> int:
        """Moves whenever cached callers were dropped (the batch worker's owners follow it)."""
        ...

    async def aclose(self) -> None: ...


@dataclass
class DashboardServices:
    """The session-only API's services (docs/reference/dashboard.md)."""

    sessions: DashboardSessions
    keys: KeyAdmin
    members: MemberAdmin
    usage: UsageReports
    platform_limits: PlatformLimits
    """The defaults a user without their own limits gets (``billing/quotas``)."""


@dataclass
class GatewayState:
    catalog: Catalog
    auth: Authenticator
    text: TextService
    audio: AudioService
    responses: ResponsesService
    tool_chat: ToolChatService
    documents: DocumentService
    video: VideoService
    embeddings: EmbeddingService
    replays: ReplayStore
    """Answers of ``Idempotency-Key`` requests (``serve_app.ingress.idempotency``)."""
    files: FileService
    adapters: AdapterService
    batches: BatchService
    batch_worker: BatchWorker | None = None  # None when args.batches.enabled is false
    dedicated: Dedicated | None = None  # None when args.dedicated.enabled is false
    dashboard: DashboardServices | None = None  # None: no sessions (API keys only)

    @functools.cached_property
    def messages(self) -> MessagesService:
        """Anthropic's Messages API (docs/reference/messages.md): a view of ``text``, which
        does all the work (limits, ledger, heads), so it is built from it, not wired apart."""
        return MessagesService(self.text)
