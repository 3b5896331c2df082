"""The composition root: one gateway replica's services, each given its collaborators
when it is constructed.

Nothing is patched in after construction. Dedicated routing is built first, so the
catalog (``alias_resolver``: ``ded/<slug>`` ids) and the text service
(``head_lookup``: their heads) take its router's hooks as constructor arguments; the
``Idempotency-Key`` replay store is built here and reaches the ingress middleware
through ``GatewayState.replays``. Two entry points:

- ``build_state``: the services from a validated config and ready head clients
  (Ray clients, or in-process cores in the unit tests' harnesses, which call it too);
- ``build_replica``: what a Serve ingress replica does when it starts: head clients
  over the bound handles, readiness from Serve's status, the database, ``build_state``,
  then the background loops; ``close_replica`` is its graceful stop.

With ``serve_app.builders`` and ``serve_app.cli``, this is the only gateway module that
imports ``deployments`` (``tests/unit/test_import_direction.py``): the in-process code
sandbox and the dedicated endpoints' head deployment are chosen here.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from deployments import registry
from deployments.local_models.reference import is_tiny
from deployments.replica_logging import configure_replica_logging
from deployments.sandbox.bwrap import BwrapSandbox
from serve_app.adapters.service import AdapterService
from serve_app.adapters.store import AdapterStore
from serve_app.auth.accounts import AccountStore
from serve_app.auth.dashboard import DashboardSessions
from serve_app.auth.epoch import EpochWatch, RedisEpochPublisher
from serve_app.auth.key_admin import KeyAdmin
from serve_app.auth.members import MemberAdmin
from serve_app.auth.oidc import OidcClient
from serve_app.auth.oidc_config import OidcOptions
from serve_app.auth.oidc_users import OidcSignIn, OidcUsers
from serve_app.auth.service import AuthService
from serve_app.auth.sessions import SessionStore
from serve_app.batches.service import BatchService
from serve_app.batches.store import BatchStore
from serve_app.batches.worker import BatchWorker
from serve_app.billing.reports import UsageReports
from serve_app.catalog.catalog import Catalog
from serve_app.catalog.config import CatalogModel
from serve_app.config import REPO_ROOT, GatewayAppArgs
from serve_app.dedicated.api.facade import Dedicated, build_dedicated
from serve_app.dedicated.control.backend import ServeBackend
from serve_app.dedicated.control.ray_backend import RayServeBackend
from serve_app.dedicated.lease import StoreLease
from serve_app.dedicated.routing.floor import build_floor_counts
from serve_app.dedicated.routing.router import DedicatedRouter
from serve_app.dedicated.store import DedicatedStore
from serve_app.files.service import FilePolicy, FileService
from serve_app.files.store import FileStore
from serve_app.heads.budget import BudgetKeeper, budget_heads, honour_pins
from serve_app.heads.client import (
    DocumentClient,
    HeadClient,
    PoolingClient,
    SpeechClient,
    TranscriptionClient,
    VideoHeadClient,
    ray_head_clients,
)
from serve_app.heads.external import ExternalHeadClient
from serve_app.heads.sleep_orders import RaySleepOrders
from serve_app.heads.waker import HeadWaker
from serve_app.inference.audio.service import AudioPolicy, AudioService
from serve_app.inference.chat.service import TextService, TimeoutPolicy
from serve_app.inference.chat.tools import ToolChatService
from serve_app.inference.documents.service import DocumentPolicy, DocumentService
from serve_app.inference.embeddings.service import EmbeddingPolicy, EmbeddingService
from serve_app.inference.images import ImagePolicy
from serve_app.inference.metering import Metering, build_metering
from serve_app.inference.readiness import HOLDING_MEMORY, HeadReadiness, serve_status_source
from serve_app.inference.responses.service import ResponsesService
from serve_app.inference.video.service import VideoService
from serve_app.jobs.store import JobStore
from serve_app.limits.buckets import CounterStore
from serve_app.limits.limiter import PlatformLimits, build_counter_store
from serve_app.metrics import GatewayMetrics
from serve_app.requests.replays import build_replay_store
from serve_app.requests.state import DashboardServices, GatewayState
from serve_app.settings import GatewaySettings, get_settings, require_production_ready
from serve_app.storage.db import Database
from serve_app.storage.objects import ObjectStore, build_object_store
from serve_app.storage.quotas import StorageLimits, StorageQuotas
from serve_app.storage.schema import utcnow
from serve_app.tools.runners import ToolRuntime
from serve_app.tools.sandbox import CodeSandbox, RemoteSandbox

logger = logging.getLogger(__name__)


def catalog_stand_ins(catalog: Iterable[CatalogModel]) -> list[tuple[str, str]]:
    """(model id, why) for each stand-in of a catalog: a test engine (``module:Class``, a
    builder registered at run time: ``deployments.registry.stand_in_engine``) or a random-weight
    ``tiny:`` model (CPU demos, tests of the GPU backends' code paths). Each answers 200 with
    output that means nothing: production refuses them, and ``gateway check`` names them."""
    found: list[tuple[str, str]] = []
    for model in catalog:
        if model.is_external:
            continue
        engine = registry.stand_in_engine(model.head, model.engine.backend)
        if engine is not None:
            found.append((model.id, engine))
        found.extend(
            (model.id, f"{value} is a random-weight tiny model (tests and CPU demos)")
            for value in _strings(model.engine.config)
            if is_tiny(value)
        )
    return found


def _strings(value: Any) -> list[str]:
    """Every string inside an engine config (model sources sit at any depth)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list | tuple):
        return [s for item in value for s in _strings(item)]
    return []


def stand_in_refusals(catalog: Iterable[CatalogModel]) -> list[str]:
    """``catalog_stand_ins`` as the lines of a ``ProductionRefused``."""
    return [f"model {model_id}: {why}" for model_id, why in catalog_stand_ins(catalog)]


def build_state(
    config: GatewayAppArgs,
    heads: dict[str, HeadClient],
    readiness: HeadReadiness,
    database: Database,
    settings: GatewaySettings,
    *,
    counters: CounterStore | None = None,
    metrics: GatewayMetrics | None = None,
    speech_heads: dict[str, SpeechClient] | None = None,
    transcription_heads: dict[str, TranscriptionClient] | None = None,
    document_heads: dict[str, DocumentClient] | None = None,
    video_heads: dict[str, VideoHeadClient] | None = None,
    pooling_heads: dict[str, PoolingClient] | None = None,
    objects: ObjectStore | None = None,
    dedicated_backend: ServeBackend | None = None,
    sandbox: CodeSandbox | None = None,
    clock: Callable[[], datetime] = utcnow,
) -> GatewayState:
    """Wire the services of one replica (shared by Ray and in-process tests).

    ``counters`` and ``metrics`` override the limit counters (default: Redis
    when ``GATEWAY_REDIS_URL`` is set, else in-process) and the metrics backend;
    ``objects`` the object store of generated videos and files (default: from settings);
    ``sandbox`` the code sandbox (default: bubblewrap in this process);
    ``clock`` the dedicated subsystem's and the batches' (tests drive a manual one)."""
    dedicated = _dedicated(config, database, settings, dedicated_backend, clock)
    router = dedicated.router if dedicated is not None else None
    catalog = Catalog(
        config.catalog, alias_resolver=router.resolve_model if router is not None else None
    )
    images = ImagePolicy(**config.images.model_dump())  # one policy: chat and documents
    metering = build_metering(config, database, settings, counters=counters, metrics=metrics)
    objects = objects or build_object_store(settings)
    adapters = _adapters(config, catalog, database, objects, heads)
    text = _text(config, catalog, heads, readiness, images, metering, router, adapters)
    tools = _tools(config, settings, sandbox)
    files = _files(config, database, objects, adapters.quotas)  # one bound: files + adapters
    state = GatewayState(
        catalog=catalog,
        auth=_auth(database, settings),
        text=text,
        audio=_audio(config, catalog, speech_heads, transcription_heads, readiness, metering),
        responses=ResponsesService(text, tools, config.responses),
        tool_chat=ToolChatService(text, tools),
        documents=_documents(config, catalog, document_heads, readiness, images, metering),
        video=_video(
            config, catalog, video_heads, readiness, database, objects, settings, metering
        ),
        embeddings=_embeddings(config, catalog, pooling_heads or {}, readiness, metering, router),
        replays=build_replay_store(settings.redis_url, prefix=config.limits.redis_prefix),
        files=files,
        batches=BatchService(BatchStore(database), files.store, config.batches, clock=clock),
        adapters=adapters,
        dedicated=dedicated,
        dashboard=_dashboard(config, database, settings),
    )
    if config.batches.enabled:
        _attach_batch_worker(state, config, database, settings, objects, metering, clock)
    return state


def _dedicated(
    config: GatewayAppArgs,
    database: Database,
    settings: GatewaySettings,
    backend: ServeBackend | None,
    clock: Callable[[], datetime],
) -> Dedicated | None:
    """Dedicated endpoints come first: the catalog and the text service take its router's
    hooks. The shared floor counts (Redis) exist only where endpoints can be deployed."""
    return build_dedicated(
        config.dedicated,
        config.catalog,
        database,
        backend,
        clock=clock,
        floor=build_floor_counts(settings.redis_url, prefix=config.limits.redis_prefix)
        if backend is not None and config.dedicated.enabled
        else None,
    )


def _text(
    config: GatewayAppArgs,
    catalog: Catalog,
    heads: dict[str, HeadClient],
    readiness: HeadReadiness,
    images: ImagePolicy,
    metering: Metering,
    router: DedicatedRouter | None,
    adapters: AdapterService,
) -> TextService:
    """Chat and completions: the catalog's heads, dedicated endpoints' heads by alias, and
    organizations' LoRA adapters (``<base>:<name>`` ids)."""
    return TextService(
        catalog,
        heads,
        readiness,
        images,
        TimeoutPolicy(**config.timeouts.model_dump()),
        metering,
        head_lookup=router.head_for if router is not None else None,
        adapters=adapters,
    )


def account_store(database: Database, settings: GatewaySettings) -> AccountStore:
    """The accounts as a replica writes them (dashboard keys, members, passwords): with
    Redis configured, each committed change is also published there (``INCR`` of the
    accounts generation), so every other replica drops its cached keys on its next
    request; without it they learned only from the database poll, up to 100 ms later,
    and a key revoked through one replica still passed on another meanwhile."""
    publish = _epoch_publisher(settings.redis_url) if settings.redis_url else None
    return AccountStore(database, pepper=settings.key_pepper, publish=publish)


@functools.lru_cache(maxsize=8)
def _epoch_publisher(redis_url: str) -> RedisEpochPublisher:
    """One publisher (one Redis client) per process and URL, whichever store writes."""
    return RedisEpochPublisher(redis_url)


def _auth(database: Database, settings: GatewaySettings) -> AuthService:
    """API keys checked against the database and cached per replica; the accounts
    generation (``serve_app.auth.epoch``) tells every replica when its cache is stale."""
    return AuthService(
        account_store(database, settings),
        settings,
        epochs=EpochWatch.build(database, settings.redis_url),
    )


def session_store(database: Database, settings: GatewaySettings) -> SessionStore:
    """Dashboard sessions, passwords and sign-in links (the CLI builds the same)."""
    return SessionStore(
        database,
        account_store(database, settings),
        ttl_s=settings.session_ttl_s,
        link_ttl_s=settings.login_link_ttl_s,
    )


def _dashboard(
    config: GatewayAppArgs, database: Database, settings: GatewaySettings
) -> DashboardServices:
    """The session-only API: sign-in attempts counted in their own counters (Redis when
    configured, so every replica counts together)."""
    counters = build_counter_store(
        settings.redis_url, window_s=60.0, prefix=f"{config.limits.redis_prefix}:login"
    )
    sessions = session_store(database, settings)
    accounts = account_store(database, settings)
    limits = config.limits
    return DashboardServices(
        sessions=DashboardSessions(sessions, counters, oidc=_oidc(config.dashboard.oidc, accounts)),
        keys=KeyAdmin(accounts),
        members=MemberAdmin(accounts, sessions),
        usage=UsageReports(database),
        platform_limits=PlatformLimits(
            rpm=limits.rpm, tpm=limits.tpm, daily_tokens=limits.daily_tokens
        ),
    )


def _oidc(options: OidcOptions | None, accounts: AccountStore) -> OidcSignIn | None:
    """The OpenID Connect provider, its secret read from the variable the config names
    (a configured provider without its secret is a start-up error, not a broken button)."""
    if options is None:
        return None
    secret = os.environ.get(options.client_secret_env, "")
    if not secret:
        raise ValueError(
            f"dashboard.oidc is configured but {options.client_secret_env} is unset "
            "(the client secret; docs/deployment.md)"
        )
    return OidcSignIn(OidcClient(options, secret), OidcUsers(accounts, options))


def _audio(
    config: GatewayAppArgs,
    catalog: Catalog,
    speech: dict[str, SpeechClient] | None,
    transcription: dict[str, TranscriptionClient] | None,
    readiness: HeadReadiness,
    metering: Metering,
) -> AudioService:
    """Speech and transcription; ``max_audio_seconds`` is bound to the transcription
    heads (``serve_app.builders``), not the service, so it stays out of its policy."""
    return AudioService(
        catalog,
        speech or {},
        transcription or {},
        readiness,
        AudioPolicy(**config.audio.model_dump(exclude={"max_audio_seconds"})),
        metering,
    )


def _documents(
    config: GatewayAppArgs,
    catalog: Catalog,
    heads: dict[str, DocumentClient] | None,
    readiness: HeadReadiness,
    images: ImagePolicy,
    metering: Metering,
) -> DocumentService:
    """Document parsing: its image inputs follow the same policy as chat's."""
    return DocumentService(
        catalog,
        heads or {},
        readiness,
        images,
        DocumentPolicy(**config.documents.model_dump()),
        metering,
    )


def _video(
    config: GatewayAppArgs,
    catalog: Catalog,
    heads: dict[str, VideoHeadClient] | None,
    readiness: HeadReadiness,
    database: Database,
    objects: ObjectStore,
    settings: GatewaySettings,
    metering: Metering,
) -> VideoService:
    """Video generation is a job: its rows in the database, its results in the object
    store behind expiring URLs, counted in the organization's stored bytes."""
    return VideoService(
        catalog,
        heads or {},
        readiness,
        JobStore(database),
        objects,
        config.video,
        url_expiry_s=settings.object_url_expiry_s,
        public_base_url=settings.public_base_url,
        metering=metering,
        quotas=_storage_quotas(config, database),  # videos count with files and adapters
    )


def _tools(
    config: GatewayAppArgs, settings: GatewaySettings, sandbox: CodeSandbox | None
) -> ToolRuntime:
    """The hosted tools of chat and responses; code runs in ``sandbox`` (the tool-runner
    replicas under Serve), else in a bubblewrap sandbox of this process."""
    production = config.deployment_mode == "production"
    return ToolRuntime.from_options(
        config.tools,
        settings.state_dir,
        sandbox=sandbox or BwrapSandbox(config.tools.code_interpreter, strict_network=production),
        seed_root=REPO_ROOT,
    )


def _files(
    config: GatewayAppArgs, database: Database, objects: ObjectStore, quotas: StorageQuotas
) -> FileService:
    """Uploaded files (batch inputs, results): rows in the database, bytes in the object
    store; the batch service and worker share its store."""
    return FileService(
        FileStore(database),
        objects,
        FilePolicy(config.batches.max_file_bytes, config.batches.files_list_limit),
        quotas=quotas,
    )


def _adapters(
    config: GatewayAppArgs,
    catalog: Catalog,
    database: Database,
    objects: ObjectStore,
    heads: dict[str, HeadClient],
) -> AdapterService:
    """Organizations' adapters, under the per-organization bounds on stored bytes and
    objects that its files share (``storage_quota``)."""
    quotas = _storage_quotas(config, database)
    return AdapterService(catalog, AdapterStore(database), objects, heads, quotas=quotas)


def _storage_quotas(config: GatewayAppArgs, database: Database) -> StorageQuotas:
    """The per-organization bound on stored bytes and objects (``storage_quota``): files,
    adapters and videos; its usage is read from their rows, so every holder agrees."""
    options = config.storage_quota
    limits = StorageLimits(options.max_bytes_per_org, options.max_objects_per_org)
    return StorageQuotas(database, limits)


def _embeddings(
    config: GatewayAppArgs,
    catalog: Catalog,
    heads: dict[str, PoolingClient],
    readiness: HeadReadiness,
    metering: Metering,
    router: DedicatedRouter | None,
) -> EmbeddingService:
    """The pooling routes' service: the catalog's heads, and dedicated endpoints' by alias."""
    return EmbeddingService(
        catalog,
        heads,
        readiness,
        EmbeddingPolicy(**config.embeddings.model_dump()),
        metering,
        head_lookup=router.pooling_head_for if router is not None else None,
    )


def _attach_batch_worker(
    state: GatewayState,
    config: GatewayAppArgs,
    database: Database,
    settings: GatewaySettings,
    objects: ObjectStore,
    metering: Metering,
    clock: Callable[[], datetime],
) -> None:
    """The replica's batch worker: its lines run through this replica's own services."""
    worker = BatchWorker(
        BatchStore(database),
        state.files.store,
        objects,
        state.catalog,
        session_store(database, settings).principal_for_key_id,  # keys and sessions
        state,
        metering,
        config.batches,
        bill=config.ledger.enabled,
        clock=clock,
        accounts_generation=state.auth.accounts_generation,
    )
    state.batch_worker = worker
    state.batches.wake = worker.wake


BUDGET_LEASE = "head-memory-budget"
"""The lease row gateway replicas take turns on before putting heads to sleep."""


def budget_keeper(
    config: GatewayAppArgs,
    app_name: str,
    deployments: dict[str, str],
    database: Database,
    settings: GatewaySettings,
) -> BudgetKeeper:
    """The heads' memory budget keeper of one gateway replica: Serve's view of which heads
    are awake, sleep orders through Ray's KV, one decision at a time under a DB lease."""
    status = serve_status_source(app_name, deployments)
    metrics = GatewayMetrics()

    def awake() -> list[str]:
        return [m for m, s in status().items() if s.state in HOLDING_MEMORY]

    budget = settings.resolved_memory_budget_gib()
    catalog = [m for m in config.catalog if m.id in deployments]
    pins = honour_pins(budget_heads(catalog), budget)
    for model_id in pins.dropped:
        logger.warning(
            "pin of head %s dropped: it does not fit the memory budget (%.1f GiB) beside the "
            "largest sleeping head %s; it is put to sleep like the others when a head needs "
            "its room (docs/deployment.md, 'Memory budget')",
            model_id,
            budget,
            pins.largest.model_id if pins.largest is not None else "-",
        )
    return BudgetKeeper(
        {h: b for h, b in budget_heads(config.catalog, budget).items() if h in deployments},
        budget,
        awake,
        RaySleepOrders(app_name, deployments),
        StoreLease(DedicatedStore(database), BUDGET_LEASE),
        on_evict=metrics.eviction,
    )


def declared_wake_s(config: GatewayAppArgs) -> dict[str, float]:
    """Head id -> the catalog's measured ``wake_s`` of its model (an adapter head wakes
    like its base): ``Retry-After`` before a replica has timed a wake of its own."""
    return {
        head: m.wake_s
        for m in config.catalog
        if m.wake_s is not None
        for head in m.head_deployments()
    }


def bound_deployments(config: GatewayAppArgs, handles: Mapping[str, Any]) -> dict[str, str]:
    """Head id -> Serve deployment name of the heads bound here: a model's own head, and its
    adapter head where it has one."""
    return {
        head: name
        for m in config.catalog
        for head, name in m.head_deployments().items()
        if head in handles
    }


def _report_wakes(waker: HeadWaker, readiness: HeadReadiness) -> None:
    """Readiness hears of each wake as it goes: sent (its time starts), answered (the head is
    up before the next poll), refused by the budget (no start left behind)."""
    waker.on_sent = readiness.wake_sent
    waker.on_awake = readiness.note_answering
    waker.on_refused = readiness.wake_refused


async def build_replica(
    args: dict[str, Any], handles: dict[str, Any], tool_runner: Any, app_name: str
) -> tuple[GatewayAppArgs, GatewayState]:
    """One Serve ingress replica's config and running services.

    ``handles``: the bound heads' DeploymentHandles by model id; ``tool_runner``: the
    code sandbox deployment's handle, or None to run code in-process; ``app_name``: the
    Serve application whose heads' status is the readiness source.
    """
    configure_replica_logging()
    config = GatewayAppArgs.model_validate(args)
    clients = ray_head_clients(config.catalog, handles)
    chat: dict[str, HeadClient] = dict(clients.chat)
    chat.update({m.id: ExternalHeadClient(m) for m in config.catalog if m.is_external})
    deployments = bound_deployments(config, handles)
    settings = get_settings()
    if config.deployment_mode == "production":  # each replica's own environment counts
        require_production_ready(settings, stand_in_refusals(config.catalog))
    database = Database.from_settings(settings)
    database.migrate()
    keeper = budget_keeper(config, app_name, deployments, database, settings)
    waker = HeadWaker({m: h for m, h in handles.items() if m in deployments}, gate=keeper.make_room)
    readiness = HeadReadiness(
        serve_status_source(app_name, deployments),
        config.readiness_refresh_s,
        waker=waker,
        on_use=keeper.note_use,
        wake_s=declared_wake_s(config),
        room_s=keeper.room_wait_s,
    )
    _report_wakes(waker, readiness)
    dedicated_backend = None
    if config.dedicated.enabled:
        from deployments.dedicated_head import DedicatedHead  # only a Serve replica needs it
        from deployments.embeddings.head import PoolingHead

        dedicated_backend = RayServeBackend(DedicatedHead, pooling_head=PoolingHead)
    state = build_state(
        config,
        chat,
        readiness,
        database,
        settings,
        speech_heads=clients.speech,
        transcription_heads=clients.transcription,
        document_heads=clients.documents,
        video_heads=clients.video,
        pooling_heads=clients.pooling,
        dedicated_backend=dedicated_backend,
        # Untrusted code runs in the tool-runner replicas, not in this process.
        sandbox=RemoteSandbox(tool_runner) if tool_runner is not None else None,
    )
    # On the replica's loop: adopt spool files a dead replica left, start flushing.
    await state.text.metering.start()
    if state.batch_worker is not None:
        state.batch_worker.start()  # claims batch work from the database, on idle capacity
    if state.dedicated is not None:
        state.dedicated.start()  # alias refresh + the (lease-guarded) reconciler
    return config, state


async def close_replica(state: GatewayState) -> None:
    """Graceful stop: hand the reconciler lease over, put running batch lines back,
    commit spooled usage, close the counter, replay-store and account connections."""
    if state.dedicated is not None:
        await state.dedicated.stop()  # hands the reconciler lease over at once
    if state.batch_worker is not None:
        await state.batch_worker.stop()  # its running lines go back for another worker
    await state.video.aclose()
    await state.text.metering.aclose()
    await state.replays.aclose()
    await state.auth.aclose()
    if state.dashboard is not None:
        await state.dashboard.sessions.aclose()
