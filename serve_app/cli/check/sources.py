"""Whether each model source an engine config names resolves on this machine.

``prepared:``, ``packaged:`` and ``tiny:`` references, local folders and hub ids: a
missing one would otherwise fail (or hang in a download) when the head starts.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from deployments.local_models.reference import PACKAGED, PREPARED, parse
from deployments.registry import Backend, Runtime
from serve_app.cli.check.problems import Problem, first_line, import_error
from serve_app.settings import GatewaySettings


def check_source(
    subject: str,
    reference: str,
    requirements: Backend,
    settings: GatewaySettings,
    *,
    hub_allowed: bool,
) -> Problem | None:
    """Whether a model reference resolves here: prepared, packaged, tiny, folder or hub."""
    parsed = parse(reference)
    if parsed is not None and parsed.scheme == PREPARED:
        return _check_prepared(subject, parsed.name, settings)
    if parsed is not None and parsed.scheme == PACKAGED:
        return _check_packaged_model(subject, parsed.name)
    if parsed is not None:
        return _check_tiny(subject, parsed.name, requirements)
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
    from deployments.local_models.model_prep import MARKER_NAME, RECIPES, locate
    from deployments.local_models.prepared_models import PREPARABLE_MODELS

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


def check_packaged(subject: str, runtime: Runtime) -> list[Problem]:
    error = import_error(runtime.module)
    if error is None:
        return []
    return [
        Problem(
            subject,
            f"its packaged model needs {runtime.module} ({first_line(error)})",
            f"pip install {runtime.distribution}",
        )
    ]


def _check_packaged_model(subject: str, dist: str) -> Problem | None:
    """``packaged:<dist>``: a model folder inside a PyPI wheel (a Whisper or pooling model)."""
    from deployments.local_models.packaged import PACKAGED_MODELS

    if dist not in PACKAGED_MODELS:
        return Problem(
            subject,
            f"packaged:{dist} is not a packaged model",
            f"use one of {', '.join(sorted(PACKAGED_MODELS))}",
        )
    problems = check_packaged(subject, Runtime(PACKAGED_MODELS[dist].module, dist))
    return problems[0] if problems else None


def _check_tiny(subject: str, kind: str, requirements: Backend) -> Problem | None:
    if requirements.tiny_kinds is None:
        return Problem(subject, f"tiny:{kind}: this backend builds no tiny models", "name a model")
    kinds = importlib.import_module(requirements.tiny_kinds).TINY_KINDS
    if kind not in kinds:
        return Problem(
            subject, f"no tiny:{kind} builder", f"use tiny:{' or tiny:'.join(sorted(kinds))}"
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
