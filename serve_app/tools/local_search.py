"""``web_search`` without the internet: a SQLite FTS5 index of pages on this machine.

An operator indexes a folder of pages (HTML, Markdown or plain text; see
``local_pages.py`` for how files become pages and get their URLs) with
``gateway search index``; the gateway's ``local`` provider answers queries
from it with the same ``SearchHit`` shape as SearXNG and Brave, so numbering,
citations and billing need nothing new. SQLite ships in the standard library
with FTS5 compiled in: ranking is FTS5's ``bm25`` (titles weigh more than
bodies) and the snippet is FTS5's ``snippet()`` around the matched terms.

Concurrency: the gateway only reads. Each query opens its own read-only
connection in a worker thread (``asyncio.to_thread``), so queries never block
the event loop or share a connection across threads; the indexer writes in
one transaction, and readers see the old index until it commits. The index is
derived data: a file of another schema version is rebuilt by the next
``gateway search index``, and refused (not misread) by queries until then.

Model text goes into a MATCH expression, where FTS5 has its own syntax
(``"``, ``*``, ``NEAR(``, ``-``, ``AND``/``OR``/``NOT``, column filters).
``fts_query`` keeps only word characters and quotes every term, so no input
can be a syntax error or a query operator.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from serve_app.tools.local_pages import Document, PageError, load_documents
from serve_app.tools.search_provider import SearchError, SearchHit

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MAX_QUERY_TERMS = 32
_TITLE_WEIGHT, _BODY_WEIGHT = 5.0, 1.0
_SNIPPET_TOKENS = 40  # FTS5 allows at most 64
_TERM = re.compile(r"\w+", re.UNICODE)
_STOP_WORDS = frozenset(
    {
        "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from",
        "how", "i", "in", "is", "it", "me", "my", "of", "on", "or", "so", "that", "the", "this",
        "to", "was", "what", "when", "where", "which", "who", "why", "will", "with", "you", "your",
    }
)  # fmt: skip

_SCHEMA = (
    """CREATE TABLE pages (
        id INTEGER PRIMARY KEY,
        url TEXT NOT NULL UNIQUE,
        page_url TEXT NOT NULL,
        page_title TEXT NOT NULL,
        position INTEGER NOT NULL,
        title TEXT NOT NULL,
        body TEXT NOT NULL,
        source TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        indexed_at REAL NOT NULL
    )""",
    "CREATE INDEX pages_by_page ON pages (page_url, position)",
    """CREATE VIRTUAL TABLE pages_fts USING fts5(
        title, body, content='pages', content_rowid='id',
        tokenize='porter unicode61 remove_diacritics 2'
    )""",
    # External-content FTS: the triggers keep the full-text index in step with pages.
    """CREATE TRIGGER pages_ai AFTER INSERT ON pages BEGIN
        INSERT INTO pages_fts(rowid, title, body) VALUES (new.id, new.title, new.body);
    END""",
    """CREATE TRIGGER pages_ad AFTER DELETE ON pages BEGIN
        INSERT INTO pages_fts(pages_fts, rowid, title, body)
        VALUES ('delete', old.id, old.title, old.body);
    END""",
    """CREATE TRIGGER pages_au AFTER UPDATE ON pages BEGIN
        INSERT INTO pages_fts(pages_fts, rowid, title, body)
        VALUES ('delete', old.id, old.title, old.body);
        INSERT INTO pages_fts(rowid, title, body) VALUES (new.id, new.title, new.body);
    END""",
)
_DROP = (
    "DROP TRIGGER IF EXISTS pages_ai",
    "DROP TRIGGER IF EXISTS pages_ad",
    "DROP TRIGGER IF EXISTS pages_au",
    "DROP TABLE IF EXISTS pages_fts",
    "DROP TABLE IF EXISTS pages",
)
_EMPTY = "the local search index has no pages yet (an operator adds them: gateway search index)"


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
    # Question words match nearly every section and only add noise to bm25; a query
    # made of nothing else is kept as it is.
    terms = [t for t in terms if t not in _STOP_WORDS] or terms
    # \\w+ has no double quote, so quoting cannot be broken out of.
    return " OR ".join(f'"{term}"' for term in terms[:MAX_QUERY_TERMS])


@dataclass
class IndexReport:
    """Files by outcome (a file counts once, whatever its number of sections)."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped: int = 0
    sections: int = 0

    @property
    def indexed(self) -> int:
        return self.added + self.updated + self.unchanged


@dataclass(frozen=True)
class IndexStats:
    path: Path
    pages: int  # files (page URLs)
    sections: int  # rows a search can return
    chars: int
    last_indexed: float | None


Progress = Callable[[str, Document | PageError], None]


class LocalSearchIndex:
    """One SQLite index file: the writer API for the CLI, the reader API for the provider."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    # -- writing (CLI, replica seeding) --

    def _connect_rw(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                if version:
                    logger.warning(
                        "rebuilding %s (schema %d -> %d)", self.path, version, SCHEMA_VERSION
                    )
                for statement in _DROP + _SCHEMA:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.close()
            raise
        return conn

    def add_documents(
        self,
        documents: Iterable[Document | PageError],
        *,
        replace: bool = False,
        only_if_empty: bool = False,
        progress: Progress | None = None,
    ) -> IndexReport:
        """Insert or update pages by URL in one transaction; unchanged ones stay as they are.

        ``replace`` empties the index first (unless no file was read: then the
        old index stays); ``only_if_empty`` does nothing when a page is
        already there (checked inside the write transaction, so replicas
        seeding at the same moment add the pages once).
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
            for document in documents:
                if isinstance(document, PageError):
                    report.skipped += 1
                    outcome = "skipped"
                else:
                    outcome = self._store(conn, document)
                    setattr(report, outcome, getattr(report, outcome) + 1)
                    report.sections += len(document.sections)
                if progress:
                    progress(outcome, document)
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
    def _store(conn: sqlite3.Connection, document: Document) -> str:
        """Upsert a file's sections; drop its sections that are gone. The file's outcome."""
        old = dict(
            conn.execute(
                "SELECT url, sha256 FROM pages WHERE page_url = ? OR url = ?",
                (document.url, document.url),
            ).fetchall()
        )
        existed = bool(old)
        now = time.time()
        changed = False
        for position, section in enumerate(document.sections):
            sha = section.sha256()
            values = (
                document.url, document.title, position, section.title, section.text,
                document.source, sha, now,
            )  # fmt: skip
            if section.url not in old:
                # The URL may belong to another file's section (two files claiming one
                # canonical URL): the file indexed last wins.
                conn.execute("DELETE FROM pages WHERE url = ?", (section.url,))
                conn.execute(
                    "INSERT INTO pages (page_url, page_title, position, title, body, source, "
                    "sha256, indexed_at, url) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*values, section.url),
                )
                changed = True
            elif old.pop(section.url) != sha:
                conn.execute(
                    "UPDATE pages SET page_url = ?, page_title = ?, position = ?, title = ?, "
                    "body = ?, source = ?, sha256 = ?, indexed_at = ? WHERE url = ?",
                    (*values, section.url),
                )
                changed = True
            else:
                conn.execute("UPDATE pages SET position = ? WHERE url = ?", (position, section.url))
        for gone in old:  # sections the file no longer has
            conn.execute("DELETE FROM pages WHERE url = ?", (gone,))
            changed = True
        if not existed:
            return "added"
        return "updated" if changed else "unchanged"

    def remove(self, urls: Iterable[str]) -> int:
        """Remove pages (every section of a page URL, or one section URL); the rows removed."""
        conn = self._connect_rw()
        try:
            conn.execute("BEGIN IMMEDIATE")
            removed = sum(
                conn.execute("DELETE FROM pages WHERE url = ? OR page_url = ?", (url, url)).rowcount
                for url in urls
            )
            conn.execute("COMMIT")
            return removed
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()

    # -- reading (the provider: any thread, one connection per call) --

    def _connect_ro(self) -> sqlite3.Connection | None:
        """A read-only connection; None while the file or its schema does not exist yet.

        Raises ``SearchError`` for an index of another schema version (the next
        ``gateway search index`` rebuilds it) and ``sqlite3.Error`` for a file
        that cannot be read (permissions, not a database).
        """
        if not self.path.is_file():
            return None
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except BaseException:
            conn.close()
            raise
        if version == SCHEMA_VERSION:
            return conn
        conn.close()
        if version == 0:  # created, schema not written yet
            return None
        raise SearchError(
            "the local search index was built by another gateway version "
            "(an operator rebuilds it: gateway search index)"
        )

    def search(self, query: str, count: int, snippet_chars: int = 400) -> list[SearchHit]:
        """The best ``count`` sections for ``query`` (bm25); ``SearchError`` on an empty index."""
        match = fts_query(query)
        try:
            conn = self._connect_ro()
            if conn is None:
                raise SearchError(_EMPTY)
            try:
                if conn.execute("SELECT 1 FROM pages LIMIT 1").fetchone() is None:
                    raise SearchError(_EMPTY)
                if match is None:
                    return []
                rows = conn.execute(
                    "SELECT p.title, p.url, snippet(pages_fts, 1, '', '', ' … ', ?) "
                    "FROM pages_fts JOIN pages p ON p.id = pages_fts.rowid "
                    "WHERE pages_fts MATCH ? "
                    "ORDER BY bm25(pages_fts, ?, ?), p.id LIMIT ?",
                    (_SNIPPET_TOKENS, match, _TITLE_WEIGHT, _BODY_WEIGHT, max(count, 0)),
                ).fetchall()
            finally:
                conn.close()
        except sqlite3.Error as err:  # unreadable or damaged file, locked past the timeout
            logger.warning("local search in %s failed: %s", self.path, err)
            raise SearchError("the local search index could not be read") from None
        return [
            SearchHit(title, url, " ".join(snippet.split())[:snippet_chars])
            for title, url, snippet in rows
        ]

    def page(self, url: str) -> tuple[str, str] | None:
        """``(title, text)`` of an indexed URL: one section, or a whole page (all its
        sections in order) for a page URL; None when the index does not hold it or
        cannot be read (web_fetch then goes to the network)."""
        try:
            conn = self._connect_ro()
            if conn is None:
                return None
            try:
                rows = (
                    conn.execute(
                        "SELECT page_title, body FROM pages WHERE page_url = ? ORDER BY position",
                        (url,),
                    ).fetchall()
                    or conn.execute(
                        "SELECT title, body FROM pages WHERE url = ?", (url,)
                    ).fetchall()
                )
            finally:
                conn.close()
        except (sqlite3.Error, SearchError) as err:
            logger.warning("local page lookup in %s failed: %s", self.path, err)
            return None
        if not rows:
            return None
        return rows[0][0], "\n\n".join(body for _, body in rows)

    def stats(self) -> IndexStats:
        """Size of the index (``sqlite3.Error``/``SearchError`` when it cannot be read)."""
        conn = self._connect_ro()
        if conn is None:
            return IndexStats(self.path, 0, 0, 0, None)
        try:
            pages, sections, chars, last = conn.execute(
                "SELECT count(DISTINCT page_url), count(*), coalesce(sum(length(body)), 0), "
                "max(indexed_at) FROM pages"
            ).fetchone()
        finally:
            conn.close()
        return IndexStats(self.path, int(pages), int(sections), int(chars), last)


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
    """Index ``paths`` when the index has no page yet; the number of files added."""
    try:
        existing = [p for p in paths if p.exists()]
        documents = load_documents(existing, base_url=base_url, root=root)
        report = index.add_documents(documents, only_if_empty=True)
    except (OSError, sqlite3.Error) as err:
        # The replica still serves without its seed; searches then say the index is empty.
        logger.warning("could not seed the local search index %s: %s", index.path, err)
        return 0
    if report.indexed:
        logger.info(
            "seeded the local search index %s: %d files, %d sections",
            index.path,
            report.indexed,
            report.sections,
        )
    return report.indexed
