"""What every check reports (a ``Problem``), and the helpers the checks share."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One thing that would stop (or mislead) a start, and what to do about it."""

    subject: str
    problem: str
    fix: str

    def line(self) -> str:
        return f"{self.subject}: {self.problem} -> fix: {self.fix}"


def import_error(module: str) -> BaseException | None:
    """Why ``module`` does not import here, or None when it does."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a library that fails while importing
        return exc
    return None


def first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def load_attr(path: str) -> Any:
    """The object a ``module:attribute`` path names (imports the module)."""
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)
