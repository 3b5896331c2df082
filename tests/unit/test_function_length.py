"""Functions stay under ~60 lines (ARCHITECTURE.md); this counts them and holds the line.

Every function and method of ``serve_app`` and ``deployments`` is measured from its
``def`` (decorators excluded) to its last line, docstring and comments included.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LIMIT = 60


def _lengths() -> dict[str, int]:
    found: dict[str, int] = {}
    for package in ("serve_app", "deployments"):
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            rel = path.relative_to(REPO_ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    key = f"{rel}::{node.name}"
                    found[key] = max(found.get(key, 0), length)
    return found


def test_no_function_is_longer_than_the_limit() -> None:
    too_long = {key: length for key, length in _lengths().items() if length > LIMIT}
    assert not too_long, f"over {LIMIT} lines (split them): {too_long}"
