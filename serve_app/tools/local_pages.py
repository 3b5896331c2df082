"""Files on disk to the pages of the local search index (``local_search.py``).

Every page needs an http(s) URL, because the URL is what a citation shows the
user and what ``web_fetch`` opens: a page's own canonical URL (``<link
rel=canonical>``, ``og:url``, or ``url:``/``canonical_url:`` in Markdown front
matter) wins, otherwise ``base_url`` + the page's path. A ``file://`` URL
would be useless to a client (it names a file on the gateway's machine) and
is refused by ``web_fetch``, so a page with neither is skipped, loudly.

Markdown files are split into sections at their level-1 and level-2 headings,
each indexed under ``URL#anchor`` (GitHub's anchor rules, so the link opens
the section on a forge or most static-site generators). Documentation is
written in long files; a section-sized result is what a question matches, its
snippet is on topic, and ``web_fetch`` of it fits the fetch limit where the
whole file would be cut off. HTML and text files are one section each.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, urlsplit

import yaml

from serve_app.tools.webpage import html_to_text

PAGE_SUFFIXES = frozenset({".html", ".htm", ".xhtml", ".md", ".markdown", ".txt"})
_HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
MAX_FILE_BYTES = 5 * 1024 * 1024
MAX_TITLE_CHARS = 300


class PageError(Exception):
    """A file that cannot become indexed pages (the message says which and why)."""


@dataclass(frozen=True)
class Section:
    """One indexed row: what a search result and a citation point to."""

    url: str
    title: str
    text: str

    def sha256(self) -> str:
        digest = hashlib.sha256()
        for part in (self.url, self.title, self.text):
            digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
        return digest.hexdigest()


@dataclass(frozen=True)
class Document:
    """One file: its page URL and title, and its sections in reading order."""

    url: str
    title: str
    source: str
    sections: list[Section]


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


def web_url(url: str | None) -> str | None:
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


def check_base_url(base_url: str) -> str:
    if web_url(base_url) is None:
        raise ValueError(f"base URL must be an absolute http(s) URL, got {base_url!r}")
    return base_url


def join_url(base_url: str, relative: str) -> str:
    """``base_url`` (a folder) + the percent-encoded relative path."""
    return base_url.rstrip("/") + "/" + quote(relative.lstrip("/"), safe="/-._~")


# ---- Markdown ----

_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.S)
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_TABLE_RULE = re.compile(r"[|:\-\s]+")


def front_matter(text: str) -> tuple[dict[str, object], str]:
    """YAML front matter (fenced by ``---`` from the first line) and the text after it."""
    match = _FRONT_MATTER.match(text)
    if not match:
        return {}, text
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return {}, text
    return (data if isinstance(data, dict) else {}), text[match.end() :]


def markdown_to_text(markdown: str) -> str:
    """Readable words of Markdown: links keep their text, markup characters go.

    Code stays (commands and option names are what people search for); only
    fences, emphasis marks, table rules and heading hashes are dropped, so
    snippets read as prose.
    """
    lines = []
    for line in _LINK.sub(r"\1", markdown).splitlines():
        stripped = line.strip()
        if _FENCE.match(line) or (stripped and _TABLE_RULE.fullmatch(stripped)):
            continue
        line = re.sub(r"^ {0,3}#{1,6}[ \t]+", "", line)
        line = re.sub(r"\*\*|__|`", "", line).replace("|", " ")
        lines.append(line.rstrip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def heading_text(raw: str) -> str:
    return " ".join(markdown_to_text(raw).split())


def github_anchor(heading: str, taken: dict[str, int]) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to
    hyphens, ``-1``, ``-2`` ... for repeats (``taken`` counts them per page)."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    seen = taken.get(slug, 0)
    taken[slug] = seen + 1
    return slug if seen == 0 else f"{slug}-{seen}"


def split_markdown(body: str) -> list[tuple[str | None, str]]:
    """``(heading or None, markdown)`` blocks, cut before each level-1/2 heading.

    Headings inside fenced code are code, not structure; the first block
    (before any split) has no heading of its own: it is the page itself.
    """
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    fenced = False
    for line in body.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match and len(match.group(1)) <= 2 and any(s.strip() for s in blocks[-1][1]):
            blocks.append((heading_text(match.group(2)), []))
        blocks[-1][1].append(line)
    return [(heading, "\n".join(lines)) for heading, lines in blocks]


def _markdown_document(raw: str, path: Path, fallback_url: str | None) -> Document:
    meta, body = front_matter(raw)
    url = web_url(str(meta.get("canonical_url") or meta.get("url") or "")) or fallback_url
    if url is None:
        raise PageError("no URL: the page names none and no base URL was given")
    title = str(meta.get("title") or "").strip()
    if not title:
        for line in body.splitlines():
            match = _HEADING.match(line)
            if match:
                title = heading_text(match.group(2))
                break
    title = (title or path.name)[:MAX_TITLE_CHARS]
    sections: list[Section] = []
    anchors: dict[str, int] = {}
    for heading, block in split_markdown(body):
        text = markdown_to_text(block)
        if heading is None:
            # The page's own section; without text beyond its title it adds nothing.
            if text and text != title:
                sections.append(Section(url, title, text))
            continue
        anchor = github_anchor(heading, anchors)
        section_title = f"{title} — {heading}"[:MAX_TITLE_CHARS]
        sections.append(Section(f"{url.split('#', 1)[0]}#{anchor}", section_title, text))
    return Document(url, title, str(path), sections)


def read_document(path: Path, relative: str, base_url: str | None) -> Document:
    """One file as a ``Document``; ``relative`` (POSIX) is appended to ``base_url``."""
    suffix = path.suffix.lower()
    if suffix not in PAGE_SUFFIXES:
        raise PageError(f"not a page type ({', '.join(sorted(PAGE_SUFFIXES))})")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise PageError(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    raw = path.read_bytes().decode("utf-8", errors="replace")
    fallback = join_url(base_url, relative) if base_url else None
    if suffix in (".md", ".markdown"):
        document = _markdown_document(raw, path, fallback)
    else:
        if suffix in _HTML_SUFFIXES:
            links = _HeadLinks()
            links.feed(raw)
            links.close()
            url = web_url(links.canonical) or web_url(links.og_url) or fallback
            title, text = html_to_text(raw)
        else:
            url, title, text = fallback, "", raw.strip()
        if url is None:
            raise PageError("no URL: the page names none and no base URL was given")
        title = (title or path.name)[:MAX_TITLE_CHARS]
        document = Document(url, title, str(path), [Section(url, title, text)] if text else [])
    if not document.sections:
        raise PageError("no text")
    return document


def iter_page_files(paths: Iterable[Path], root: Path | None) -> Iterator[tuple[Path, str]]:
    """``(file, relative path)`` of every page file under ``paths``, in a stable order.

    The relative path is from ``root`` when given (a repository root, so that
    ``docs/api.md`` keeps its folder), else from each folder argument (a site
    mirror's folder is the site root), or the file name for a file argument.
    Hidden files and folders are skipped.
    """
    for path in paths:
        if path.is_dir():
            anchor = path
            files = sorted(
                p
                for p in path.rglob("*")
                if p.is_file()
                and p.suffix.lower() in PAGE_SUFFIXES
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
        elif path.is_file():
            anchor, files = path.parent, [path]
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")
        for file in files:
            try:
                relative = file.resolve().relative_to((root or anchor).resolve()).as_posix()
            except ValueError:  # outside --root: from its own argument
                relative = file.relative_to(anchor).as_posix()
            yield file, relative


def load_documents(
    paths: Iterable[Path], *, base_url: str | None, root: Path | None
) -> Iterator[Document | PageError]:
    """Every page file under ``paths``; unreadable ones come out as ``PageError``."""
    for file, relative in iter_page_files(paths, root):
        try:
            yield read_document(file, relative, base_url)
        except (PageError, OSError) as err:
            yield PageError(f"{file}: {err}")
