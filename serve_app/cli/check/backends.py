"""One catalog entry's engine: its backend imports, its config validates, its sources resolve.

The backend's runtime libraries are imported (not started) and ``engine.config`` is
validated with the backend's own pydantic class, so a missing library or a typo fails
here instead of in a replica's crash loop.
"""

from __future__ import annotations

import sys
from typing import Any

from pydantic import ValidationError

from deployments import registry
from deployments.registry import Backend, model_references
from serve_app.catalog.config import CatalogModel
from serve_app.cli.check.problems import Problem, first_line, import_error, load_attr
from serve_app.cli.check.sources import check_packaged, check_source
from serve_app.cli.check.vllm_args import check_vllm_args
from serve_app.settings import GatewaySettings


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
    requirements = registry.BACKENDS.get((model.head, backend))
    if requirements is None or registry.registered(model.head, backend) is not None:
        if registry.is_known(model.head, backend):
            return []  # registered at run time (a test's scripted engine): nothing to import
        known = registry.names(model.head)
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
            f"backend {backend} cannot import {runtime.module} ({first_line(error)})",
            f"pip install {runtime.distribution} (the cpu and gpu extras of pyproject.toml "
            "bring it; make install on a CPU machine)",
        )
        for runtime in requirements.runtime
        if (error := import_error(runtime.module)) is not None
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
        problems.extend(check_packaged(subject, requirements.packaged_default))
    local_only = bool(getattr(parsed, "local_files_only", False))
    for reference in references:
        problem = check_source(
            subject, reference, requirements, settings, hub_allowed=hub_allowed and not local_only
        )
        if problem is not None:
            problems.append(problem)
    return problems


def _check_class_backend(subject: str, backend: str) -> list[Problem]:
    module_name, _, attr = backend.partition(":")
    error = import_error(module_name)
    if error is not None:
        return [
            Problem(subject, f"cannot import {module_name} ({first_line(error)})", "install it")
        ]
    if not isinstance(getattr(sys.modules[module_name], attr, None), type):
        return [Problem(subject, f"{module_name} has no class {attr}", "correct engine.backend")]
    return []


def _validated_config(
    subject: str, requirements: Backend, config: dict[str, Any]
) -> tuple[Any, list[Problem]]:
    try:
        config_class = load_attr(requirements.config)
    except Exception as exc:
        return None, [
            Problem(
                subject,
                f"cannot import {requirements.config} ({first_line(exc)})",
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
