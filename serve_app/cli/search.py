"""``gateway search index|query|stats|remove``: the index of the ``local`` search provider.

The ``local`` web_search provider (``serve_app/tools/local_search.py``) reads a
SQLite FTS5 file, by default ``GATEWAY_STATE_DIR/search/index.db``: the same
path these commands use, so indexing here is all a running gateway needs (no
restart: every query opens the file anew). ``query`` runs the exact search
the gateway runs, to check what the model will see.
"""

from __future__ import annotations

import argparse
import functools
import sqlite3
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from serve_app.cli.errors import CommandError
from serve_app.settings import GatewaySettings
from serve_app.tools.local_pages import Document, PageError, check_base_url, load_documents
from serve_app.tools.local_search import LocalSearchIndex, default_index_path
from serve_app.tools.search import SearchError

_SubParsers = Any  # argparse's _SubParsersAction is private and generic


def register(subparsers: _SubParsers) -> None:
    search = subparsers.add_parser(
        "search",
        help="the local web_search index: add pages, try queries, show its size",
        description="Manage the SQLite FTS5 index that web_search reads when the Serve config "
        "sets tools.web_search.provider: local (no internet needed).",
    )
    commands = search.add_subparsers(title="commands", dest="search_command", required=True)
    where = _where_options()
    _add_index(commands, where)
    _add_query(commands, where)
    _add_stats_and_remove(commands, where)


def _where_options() -> argparse.ArgumentParser:
    """The options every command shares: which index file."""
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--index",
        type=Path,
        default=None,
        metavar="FILE",
        help="index file (default: STATE_DIR/search/index.db, what the local provider reads "
        "unless tools.web_search.local.index_path says otherwise)",
    )
    where.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="gateway state folder (default: $GATEWAY_STATE_DIR or "
        "~/.local/share/inference-gateway)",
    )
    return where


def _add_index(commands: _SubParsers, where: argparse.ArgumentParser) -> None:
    index = commands.add_parser(
        "index",
        parents=[where],
        help="add or update pages (HTML, Markdown, text) from files and folders",
        description="Index every .html/.htm/.xhtml/.md/.markdown/.txt file under PATH (hidden "
        "files skipped). Each page needs an http(s) URL, the one a citation shows and "
        "web_fetch opens: its own <link rel=canonical> / og:url (HTML) or url: / "
        "canonical_url: front matter (Markdown), else BASE_URL + its path. Pages with neither "
        "are skipped. Markdown is indexed per section (level-1/2 headings) under URL#anchor "
        "(GitHub's anchors). Re-indexing updates changed pages (by URL), drops sections a "
        "page no longer has, and leaves other pages alone.",
    )
    index.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="file or folder")
    index.add_argument(
        "--base-url",
        default=None,
        metavar="URL",
        help="where the pages are published, e.g. https://docs.example.com/ ; a page's URL "
        "is URL + its path relative to --root",
    )
    index.add_argument(
        "--root",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder page paths are relative to (default: each folder PATH itself; a file "
        "PATH: its own folder)",
    )
    index.add_argument(
        "--replace", action="store_true", help="empty the index first (a full rebuild)"
    )
    index.add_argument("-q", "--quiet", action="store_true", help="no line per page")
    index.set_defaults(handler=_index_errors(_index))


def _add_query(commands: _SubParsers, where: argparse.ArgumentParser) -> None:
    query = commands.add_parser(
        "query",
        parents=[where],
        help="run a search the way web_search does",
        description="Print the pages the local provider returns for TEXT: rank, title, URL "
        "and snippet, best first (bm25).",
    )
    query.add_argument("text", nargs="+", metavar="TEXT", help="the query")
    query.add_argument(
        "-n", "--count", type=int, default=5, metavar="N", help="results (default 5)"
    )
    query.set_defaults(handler=_index_errors(_query))


def _add_stats_and_remove(commands: _SubParsers, where: argparse.ArgumentParser) -> None:
    stats = commands.add_parser(
        "stats",
        parents=[where],
        help="pages, text size and last update of the index",
        description="Print the index file, its page count, indexed text size and when a page "
        "was last added or changed.",
    )
    stats.set_defaults(handler=_index_errors(_stats))

    remove = commands.add_parser(
        "remove",
        parents=[where],
        help="remove pages by URL",
        description="Remove pages from the index: a page URL removes all its sections, a "
        "section URL (with #anchor) that section only.",
    )
    remove.add_argument("urls", nargs="+", metavar="URL", help="page URL")
    remove.set_defaults(handler=_index_errors(_remove))


_Handler = Callable[[argparse.Namespace, GatewaySettings], int]


def _index_errors(handler: _Handler) -> _Handler:
    """A file SQLite cannot use (permissions, not a database) is the user's to fix."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace, settings: GatewaySettings) -> int:
        try:
            return handler(args, settings)
        except sqlite3.Error as err:
            raise CommandError(f"search index: {err}") from None
        except SearchError as err:
            raise CommandError(str(err)) from None

    return run


def _index_of(args: argparse.Namespace, settings: GatewaySettings) -> LocalSearchIndex:
    if args.index is not None:
        return LocalSearchIndex(args.index.expanduser())
    state_dir = args.state_dir.expanduser() if args.state_dir else settings.state_dir
    return LocalSearchIndex(default_index_path(state_dir))


def _index(args: argparse.Namespace, settings: GatewaySettings) -> int:
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        raise CommandError(f"no such file or folder: {', '.join(missing)}")
    if args.root is not None and not args.root.is_dir():
        raise CommandError(f"--root is not a folder: {args.root}")
    base_url = None
    if args.base_url is not None:
        try:
            base_url = check_base_url(args.base_url)
        except ValueError as err:
            raise CommandError(str(err)) from None
    index = _index_of(args, settings)
    print(f"indexing into {index.path}", file=sys.stderr, flush=True)
    seen = 0

    def progress(outcome: str, document: Document | PageError) -> None:
        nonlocal seen
        seen += 1
        if args.quiet:
            return
        if isinstance(document, PageError):
            print(f"[{seen}] skipped    {document}", file=sys.stderr, flush=True)
            return
        parts = len(document.sections)
        print(
            f"[{seen}] {outcome:<10} {document.url}  ({document.source}, "
            f"{parts} section{'s' if parts > 1 else ''})",
            file=sys.stderr,
            flush=True,
        )

    documents = load_documents(args.paths, base_url=base_url, root=args.root)
    report = index.add_documents(documents, replace=args.replace, progress=progress)
    stats = index.stats()
    print(
        f"files: {report.added} added, {report.updated} updated, {report.unchanged} "
        f"unchanged, {report.skipped} skipped; the index holds {stats.pages} pages "
        f"({stats.sections} sections)"
    )
    if report.skipped and base_url is None:
        print("hint: pages without their own URL need --base-url", file=sys.stderr)
    if not report.indexed:
        kept = " (--replace: the index was left as it was)" if args.replace else ""
        raise CommandError(f"no page was indexed{kept}")
    return 0


def _query(args: argparse.Namespace, settings: GatewaySettings) -> int:
    if args.count < 1:
        raise CommandError("--count must be at least 1")
    index = _index_of(args, settings)
    try:
        hits = index.search(" ".join(args.text), args.count)
    except SearchError as err:
        raise CommandError(f"{err} ({index.path})") from None
    if not hits:
        print("No results.")
        return 0
    for rank, hit in enumerate(hits, 1):
        print(f"[{rank}] {hit.title}\n    {hit.url}\n    {hit.snippet}")
    return 0


def _stats(args: argparse.Namespace, settings: GatewaySettings) -> int:
    stats = _index_of(args, settings).stats()
    last = (
        datetime.fromtimestamp(stats.last_indexed, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        if stats.last_indexed
        else "never"
    )
    print(f"index:        {stats.path}")
    print(f"pages:        {stats.pages}")
    print(f"sections:     {stats.sections}")
    print(f"text:         {stats.chars} characters")
    print(f"last change:  {last}")
    return 0


def _remove(args: argparse.Namespace, settings: GatewaySettings) -> int:
    index = _index_of(args, settings)
    if not index.path.is_file():
        raise CommandError(f"no index at {index.path}")
    removed = index.remove(args.urls)
    print(f"{removed} sections removed")
    return 0 if removed else 1
