"""What the code and the docs cite can be read by whoever clones the repository.

The contract the code is written against is ``docs/reference/`` (and the implementation
notes ``docs/api.md``). A comment that cites a document outside the repository ("spec
4.1", a path into a shared folder) points a reader at nothing, so:

- no text file of the repository cites a contract section by number ("spec 4.1", "spec
  section 5") or "the spec", nor names a file outside it (``../shared/...``, the
  contract files that used to live there);
- every pointer into the docs (``docs/reference/chat.md#streams`` in a comment, a
  relative ``[link](chat.md#streams)`` in a doc) names a file that exists and, after
  ``#``, a heading of that file (GitHub's anchors).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".txt", ".sh", ".json"}
SKIPPED_DIRS = {
    ".git",
    ".venv",
    "var",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
}

OUTSIDE = re.compile(
    r"\bspec(?:'s)?\s+(?:section\s+|§\s*)?\d"  # "spec 4.1", "Spec section 5", "spec's 2.3"
    r"|\bspec\s+sections?\b"
    r"|\bthe\s+spec(?:'s)?\b"  # "the spec's 503", "the spec requires"
    r"|\bspec\s+voices?\b"
    r"|\bsections?\s+\d+\.\d"  # "section 2.5" of a document not named
    r"|\b(?:inference|dedicated)-api\b|[\w-]*-api\.md\b"  # the contract files once outside
    r"|\.\./shared\b|\bshared/(?:spec|DESIGN|MODELS)|(?-i:\b(?:DESIGN|MODELS)\.md\b)",
    re.IGNORECASE,
)
DOC_POINTER = re.compile(r"(?<![\w/.-])(docs/[\w./-]*?\.md)(?:#([\w-]+))?")
MD_LINK = re.compile(r"\]\((?!https?:|mailto:)([^)#\s]*\.md)?(?:#([\w-]+))?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def text_files(root: Path) -> Iterator[Path]:
    """Every text file of the tree the test reads (sources, docs, configs, fixtures)."""
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(dirpath) / name
            if path.suffix in TEXT_SUFFIXES or name == "Makefile":
                yield path


def outside_references(root: Path, skip: frozenset[Path] = frozenset()) -> list[str]:
    """``file:line: text`` for every line citing the old contract or a file outside ``root``."""
    found = []
    for path in text_files(root):
        if path.resolve() in skip:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (repeated headings get ``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    found = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_pointers(root: Path, skip: frozenset[Path] = frozenset()) -> list[str]:
    """``file:line: pointer (why)`` for each pointer into the docs that leads nowhere."""
    found = []
    for path in text_files(root):
        if path.resolve() in skip:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            targets = [
                (root / m.group(1), m.group(2), m.group(0)) for m in DOC_POINTER.finditer(line)
            ]
            if path.suffix == ".md":
                targets += [
                    ((path.parent / m.group(1)) if m.group(1) else path, m.group(2), m.group(0))
                    for m in MD_LINK.finditer(line)
                    if m.group(1) or m.group(2)
                ]
            for target, anchor, text in targets:
                why = None
                if not target.is_file():
                    why = "no such file"
                elif anchor and anchor not in anchors(target):
                    why = f"no heading #{anchor}"
                if why:
                    found.append(f"{path.relative_to(root)}:{number}: {text} ({why})")
    return found


def test_nothing_cites_a_file_outside_the_repository() -> None:
    assert (REPO_ROOT / "docs" / "reference" / "README.md").is_file()  # the real tree is read
    found = outside_references(REPO_ROOT, skip=frozenset({Path(__file__).resolve()}))
    assert not found, "cite docs/reference/<file>.md#<section> instead:\n" + "\n".join(found)


def test_every_pointer_into_the_docs_resolves() -> None:
    found = broken_pointers(REPO_ROOT, skip=frozenset({Path(__file__).resolve()}))
    assert not found, "pointers to missing docs or sections:\n" + "\n".join(found)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    "text, cites_outside",
    [
        ('"""Unknown fields are relayed (spec 4.1)."""\n', True),
        ("# Spec section 5.4 reserves them\n", True),
        ("x = 1  # the spec's 503\n", True),
        ("The contract is `shared/spec/inference-api.md`.\n", True),
        ("see ../shared/MODELS.md\n", True),
        ("waits forever (MODELS.md)\n", True),
        ("Every refusal of dedicated-api section 7\n", True),
        ("estimated_cost of section 2.5\n", True),
        ("prepared as docs/models.md says\n", False),
        ("every spec voice is rendered\n", True),
        ('"""Unknown fields are relayed (docs/reference/chat.md#chat-request)."""\n', False),
        ("app_spec = build_spec(deployment)  # a Serve deployment spec\n", False),
        ("speculative_tokens: 0\n", False),
    ],
)
def test_the_checker_finds_citations_of_outside_files(
    tmp_path: Path, text: str, cites_outside: bool
) -> None:
    root = _tree(tmp_path, {"serve_app/x.py": text})
    assert bool(outside_references(root)) is cites_outside


def test_the_checker_finds_pointers_that_lead_nowhere(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "docs/reference/chat.md": "# Chat\n\n## Chat request\n\n```\n# not a heading\n```\n"
            "See [streams](#streams), [request](#chat-request), [c](common.md#keys).\n",
            "docs/reference/common.md": "# Common\n\n## Keys\n",
            "serve_app/a.py": "# docs/reference/chat.md#chat-request, docs/reference/common.md\n",
            "serve_app/b.py": "# docs/reference/chat.md#not-a-heading and docs/reference/gone.md\n",
        },
    )
    assert broken_pointers(root) == [
        "docs/reference/chat.md:8: ](#streams) (no heading #streams)",
        "serve_app/b.py:1: docs/reference/chat.md#not-a-heading (no heading #not-a-heading)",
        "serve_app/b.py:1: docs/reference/gone.md (no such file)",
    ]
