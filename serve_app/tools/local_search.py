"""``web_search`` without the internet: a SQLite FTS5 index of pages on this machine.

An operator indexes a folder of pages (HTML, Markdown or plain text) with
``gateway search index``; the gateway's ``local`` provider answers queries
from it with the same ``SearchHit`` shape as SearXNG and Brave, so numbering,
citations and billing need nothing new. SQLite ships in the standard library
with FTS5 compiled in: ranking is FTS5's ``bm25`` (titles weigh more than
bodies) and the snippet is FTS5's ``snippet()`` around the matched terms.

Every page needs an http(s) URL, because the URL is what a citation shows
the user and what ``web_fetch`` opens: a page's own canonical URL (``<link
rel=canonical>``, ``og:url``, or ``url:`` in Markdown front matter) wins,
otherwise ``base_url`` + the page's path. A ``file://`` URL would be useless
to a client and refused by ``web_fetch``, so a page with neither is skipped.

Concurrency: the gateway only reads. Each query opens its own read-only
connection in a worker thread (``asyncio.to_thread``), so queries never block
the event loop or share a connection across threads; the indexer writes in
one transaction, and readers see the old index until it commits.

Model text goes into a MATCH expression, where FTS5 has its own syntax
(``"``, ``*``, ``NEAR(``, ``-``, ``AND``/``OR``/``NOT``, column filters).
``fts_query`` keeps only word characters and quotes every term, so no input
can be a syntax error or a query operator.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, urlsplit

import yaml

from serve_app.tools.search import SearchError, SearchHit
from serve_app.tools.webpage import html_to_text

logger = logging.getLogger(__name__)

PAGE_SUFFIXES = frozenset({".html", ".htm", ".xhtml", ".md", ".markdown", ".txt"})
MAX_FILE_BYTES = 5 * 1024 * 1024
MAX_QUERY_TERMS = 32
_TITLE_WEIGHT, _BODY_WEIGHT = 5.0, 1.0
_SNIPPET_TOKENS = 40  # FTS5 allows at most 64
_TERM = re.compile(r"\w+", re.UNICODE)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pages (
    id INTEGER PRIMARY KEY,
    url TEXT NOT NULL UNIQUE,
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    source TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    indexed_at REAL NOT NULL
);
CREATE VIRTUAL TABLE IF NOT EXISTS pages_fts USING fts5(
    title, body, content='pages', content_rowid='id',
    tokenize='porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS pages_ai AFTER INSERT ON pages BEGIN
    INSERT INTO pages_fts(rowid, title, body) VALUES (new.id, new.title, new.body);
END;
CREATE TRIGGER IF NOT EXISTS pages_ad AFTER DELETE ON pages BEGIN
    INSERT INTO pages_fts(pages_fts, rowid, title, body)
    VALUES ('delete', old.id, old.title, old.body);
END;
CREATE TRIGGER IF NOT EXISTS pages_au AFTER UPDATE ON pages BEGIN
    INSERT INTO pages_fts(pages_fts, rowid, title, body)
    VALUES ('delete', old.id, old.title, old.body);
    INSERT INTO pages_fts(rowid, title, body) VALUES (new.id, new.title, new.body);
END;
"""


class PageError(Exception):
    """A file that cannot become an indexed page (the message says why)."""


def default_index_path(state_dir: Path) -> Path:
    """Where the CLI writes and the ``local`` provider reads unless told otherwise."""
    return state_dir / "search" / "index.db"


def fts_query(text: str) -> str | None:
    """A MATCH expression any text is safe in: its words, each quoted, joined by OR.

    OR, not FTS5's implicit AND: a question in natural language has words no
    page contains ("what", "does"), and bm25 already ranks pages that match
    more and rarer terms first. ``None`` when the text has no word at all.
    """
    terms: list[str] = []
    for term in _TERM.findall(text.casefold()):
        if term not in terms:
            terms.append(term)
    if not terms:
        return None
    # \\w+ has no double quote, so quoting cannot be broken out of.
    return " OR ".join(f'"{term}"' for term in terms[:MAX_QUERY_TERMS])


@dataclass(frozen=True)
class Page:
    url: str
    title: str
    text: str
    source: str  # the file it came from (shown by stats and progress)

    @property
    def sha256(self) -> str:
        digest = hashlib.sha256()
        for part in (self.url, self.title, self.text):
            digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
        return digest.hexdigest()


@dataclass
class IndexReport:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped: int = 0

    @property
    def indexed(self) -> int:
        return self.added + self.updated + self.unchanged


@dataclass(frozen=True)
class IndexStats:
    path: Path
    pages: int
    bytes: int
    last_indexed: float | None


# ---- reading pages ----


class _HeadLinks(HTMLParser):
    """``<link rel=canonical href>`` and ``<meta property=og:url content>``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.canonical: str | None = None
        self.og_url: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k.lower(): (v or "").strip() for k, v in attrs}
        if tag == "link" and "canonical" in values.get("rel", "").lower().split():
            self.canonical = self.canonical or values.get("href") or None
        elif tag == "meta" and values.get("property", "").lower() == "og:url":
            self.og_url = self.og_url or values.get("content") or None


def _web_url(url: str | None) -> str | None:
    """``url`` if it is an absolute http(s) URL with a host, else None."""
    if not url:
        return None
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    return url.strip()


def _front_matter(text: str) -> tuple[dict[str, object], str]:
    """YAML front matter (``---`` fenced, first line) and the text after it."""
    match = re.match(r"\A---[ \t]*\r?\n(.*?)\r?\n(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", text, re.S)
    if not match:
        return {}, text
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return {}, text
    return (data if isinstance(data, dict) else {}), text[match.end() :]


_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def markdown_to_text(markdown: str) -> str:
    """Readable words of Markdown: links keep their text, markup characters go.

    Code stays (commands and option names are what people search for); only
    the fences, emphasis marks, table rules and heading hashes are dropped, so
    snippets read as prose.
    """
    text = _MD_LINK.sub(r"\1", markdown)
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")) or re.fullmatch(r"[|:\-\s]+", stripped or "x"):
            continue
        line = re.sub(r"^\s{0,3}#{1,6}\s+", "", line)
        line = re.sub(r"(\*\*|__|`)", "", line)
        line = line.replace("|", " ")
        lines.append(line.rstrip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def read_page(path: Path, relative: str, base_url: str | None) -> Page:
    """One file as a ``Page``; ``relative`` (a POSIX path) is appended to ``base_url``."""
    if path.suffix.lower() not in PAGE_SUFFIXES:
        raise PageError(f"not a page type ({', '.join(sorted(PAGE_SUFFIXES))})")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise PageError(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    raw = path.read_bytes().decode("utf-8", errors="replace")
    own_url: str | None = None
    if path.suffix.lower() in (".html", ".htm", ".xhtml"):
        links = _HeadLinks()
        links.feed(raw)
        links.close()
        own_url = _web_url(links.canonical) or _web_url(links.og_url)
        title, text = html_to_text(raw)
    else:
        meta, body = _front_matter(raw)
        own_url = _web_url(str(meta.get("canonical_url") or meta.get("url") or ""))
        title = str(meta.get("title") or "").strip()
        if not title and path.suffix.lower() != ".txt":
            heading = _MD_HEADING.search(body)
            title = heading.group(1).strip() if heading else ""
        text = markdown_to_text(body) if path.suffix.lower() != ".txt" else body.strip()
    url = own_url or (join_url(base_url, relative) if base_url else None)
    if url is None:
        raise PageError("no URL: the page names none and no --base-url was given")
    if not text.strip():
        raise PageError("no text")
    return Page(url=url, title=(title or path.name)[:500], text=text, source=str(path))


def join_url(base_url: str, relative: str) -> str:
    """``base_url`` + the percent-encoded relative path (``base_url`` is a folder)."""
    return base_url.rstrip("/") + "/" + quote(relative.lstrip("/"), safe="/-._~")


def check_base_url(base_url: str) -> str:
    if _web_url(base_url) is None:
        raise ValueError(f"base URL must be an absolute http(s) URL, got {base_url!r}")
    return base_url


def iter_page_files(paths: Iterable[Path], root: Path | None) -> Iterator[tuple[Path, str]]:
    """``(file, relative path)`` of every page file under ``paths``, in a stable order.

    The relative path is from ``root`` when given (a repository root, so that
    ``docs/api.md`` keeps its folder), else from each folder argument (a site
    mirror's folder is the site root), or the file name for a file argument.
    Hidden files and folders are skipped.
    """
    for path in paths:
        if path.is_dir():
            files = sorted(
                p
                for p in path.rglob("*")
                if p.is_file()
                and p.suffix.lower() in PAGE_SUFFIXES
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            anchor = path
        elif path.is_file():
            files, anchor = [path], path.parent
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")
        for file in files:
            base = root if root is not None else anchor
            try:
                relative = file.resolve().relative_to(base.resolve()).as_posix()
            except ValueError:
                relative = file.relative_to(anchor).as_posix()
            yield file, relative


# ---- the index ----


class LocalSearchIndex:
    """One SQLite index file: the writer API for the CLI, the reader API for the provider."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    # -- writing (CLI, replica seeding) --

    def _connect_rw(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        conn.executescript(_SCHEMA)
        return conn

    def add_pages(
        self,
        pages: Iterable[Page | PageError],
        *,
        replace: bool = False,
        only_if_empty: bool = False,
        progress: Callable[[str, Page | PageError], None] | None = None,
    ) -> IndexReport:
        """Insert or update pages by URL in one transaction; unchanged pages are left alone.

        ``replace`` empties the index first (unless no page was read: then the
        old index stays); ``only_if_empty`` does nothing when
        a page is already there (checked inside the write transaction, so
        replicas seeding at the same time add the pages once).
        """
        report = IndexReport()
        conn = self._connect_rw()
        try:
            conn.execute("BEGIN IMMEDIATE")
            if only_if_empty and conn.execute("SELECT 1 FROM pages LIMIT 1").fetchone():
                conn.execute("ROLLBACK")
                return report
            if replace:
                conn.execute("DELETE FROM pages")
            for page in pages:
                if isinstance(page, PageError):
                    report.skipped += 1
                    if progress:
                        progress("skipped", page)
                    continue
                outcome = self._upsert(conn, page)
                setattr(report, outcome, getattr(report, outcome) + 1)
                if progress:
                    progress(outcome, page)
            if replace and not report.indexed:
                conn.execute("ROLLBACK")  # a rebuild from nothing keeps the old index
                return report
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()
        return report

    @staticmethod
    def _upsert(conn: sqlite3.Connection, page: Page) -> str:
        row = conn.execute("SELECT sha256 FROM pages WHERE url = ?", (page.url,)).fetchone()
        if row is not None and row[0] == page.sha256:
            return "unchanged"
        values = (page.title, page.text, page.source, page.sha256, time.time(), page.url)
        if row is None:
            conn.execute(
                "INSERT INTO pages (title, body, source, sha256, indexed_at, url) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                values,
            )
            return "added"
        conn.execute(
            "UPDATE pages SET title = ?, body = ?, source = ?, sha256 = ?, indexed_at = ? "
            "WHERE url = ?",
            values,
        )
        return "updated"

    def remove(self, urls: Iterable[str]) -> int:
        conn = self._connect_rw()
        try:
            with conn:
                return sum(
                    conn.execute("DELETE FROM pages WHERE url = ?", (url,)).rowcount for url in urls
                )
        finally:
            conn.close()

    # -- reading (the provider: any thread, one connection per call) --

    def _connect_ro(self) -> sqlite3.Connection | None:
        """A read-only connection, or None while no index file exists."""
        if not self.path.is_file():
            return None
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=10.0, check_same_thread=True)
        try:
            conn.execute("SELECT 1 FROM pages_fts LIMIT 0")
        except sqlite3.OperationalError:  # a file without our tables
            conn.close()
            return None
        return conn

    def search(self, query: str, count: int, snippet_chars: int = 400) -> list[SearchHit]:
        """The best ``count`` pages for ``query`` (bm25), or ``SearchError`` on an empty index."""
        conn = self._connect_ro()
        if conn is None:
            raise SearchError(_EMPTY)
        try:
            if conn.execute("SELECT 1 FROM pages LIMIT 1").fetchone() is None:
                raise SearchError(_EMPTY)
            match = fts_query(query)
            if match is None:
                return []
            rows = conn.execute(
                "SELECT p.title, p.url, "
                "snippet(pages_fts, 1, '', '', ' … ', ?) "
                "FROM pages_fts JOIN pages p ON p.id = pages_fts.rowid "
                "WHERE pages_fts MATCH ? "
                "ORDER BY bm25(pages_fts, ?, ?), p.id LIMIT ?",
                (_SNIPPET_TOKENS, match, _TITLE_WEIGHT, _BODY_WEIGHT, max(count, 0)),
            ).fetchall()
        except sqlite3.OperationalError as err:  # locked past the timeout, corrupt file
            logger.warning("local search failed: %s", err)
            raise SearchError("the local search index could not be read") from None
        finally:
            conn.close()
        return [
            SearchHit(title, url, " ".join(snippet.split())[:snippet_chars])
            for title, url, snippet in rows
        ]

    def page(self, url: str) -> tuple[str, str] | None:
        """``(title, text)`` of an indexed URL, or None."""
        conn = self._connect_ro()
        if conn is None:
            return None
        try:
            row = conn.execute("SELECT title, body FROM pages WHERE url = ?", (url,)).fetchone()
        except sqlite3.OperationalError:
            return None
        finally:
            conn.close()
        return (row[0], row[1]) if row else None

    def stats(self) -> IndexStats:
        conn = self._connect_ro()
        if conn is None:
            return IndexStats(self.path, 0, 0, None)
        try:
            pages, size, last = conn.execute(
                "SELECT count(*), coalesce(sum(length(body)), 0), max(indexed_at) FROM pages"
            ).fetchone()
        finally:
            conn.close()
        return IndexStats(self.path, int(pages), int(size), last)


_EMPTY = "the local search index has no pages yet (an operator adds them: gateway search index)"


def load_pages(
    paths: Iterable[Path], *, base_url: str | None, root: Path | None
) -> Iterator[Page | PageError]:
    """Read every page file under ``paths``; unreadable ones come out as ``PageError``."""
    for file, relative in iter_page_files(paths, root):
        try:
            yield read_page(file, relative, base_url)
        except (PageError, OSError) as err:
            yield PageError(f"{file}: {err}")


class LocalSearchProvider:
    """The ``local`` provider: queries run off the event loop, one connection each."""

    def __init__(self, index: LocalSearchIndex, snippet_chars: int = 400) -> None:
        self.index = index
        self.snippet_chars = snippet_chars

    async def search(self, query: str, count: int) -> list[SearchHit]:
        return await asyncio.to_thread(self.index.search, query, count, self.snippet_chars)

    async def stored_page(self, url: str) -> tuple[str, str] | None:
        """The indexed text of ``url`` (``web_fetch`` without the network), or None."""
        return await asyncio.to_thread(self.index.page, url)


def seed_index(index: LocalSearchIndex, paths: list[Path], base_url: str, root: Path) -> int:
    """Index ``paths`` when the index has no page yet; the number of pages added."""
    try:
        existing = [p for p in paths if p.exists()]
        report = index.add_pages(
            load_pages(existing, base_url=base_url, root=root), only_if_empty=True
        )
    except (OSError, sqlite3.Error) as err:
        # A replica still serves without its seed pages; searches then say the index is empty.
        logger.warning("could not seed the local search index %s: %s", index.path, err)
        return 0
    if report.added:
        logger.info("seeded the local search index %s with %d pages", index.path, report.added)
    return report.added
