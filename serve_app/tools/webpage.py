"""Page bytes to the plain text a model reads (``web_fetch``).

The standard library's ``HTMLParser`` is enough: the model needs the words,
not the layout. Scripts, styles and other non-content elements are dropped,
block elements become line breaks, runs of whitespace collapse. The parser
never raises on broken markup, which matters for pages an attacker wrote.
"""

from __future__ import annotations

import json
import re
from email.message import Message
from html.parser import HTMLParser

from serve_app.tools.safe_fetch import FetchedPage, FetchError

_SKIPPED = frozenset({"script", "style", "noscript", "template", "svg", "head", "iframe", "canvas"})
_BLOCKS = frozenset(
    {
        "p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header",
        "footer", "nav", "aside", "main", "h1", "h2", "h3", "h4", "h5", "h6", "pre",
        "blockquote", "hr", "dt", "dd", "figcaption", "form",
    }
)  # fmt: skip
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml+xml")


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: list[str] = []
        self._skip_depth = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in _SKIPPED:
            self._skip_depth += 1
        elif tag in _BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in _SKIPPED:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag in _BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
        elif not self._skip_depth:
            self.parts.append(data)


def html_to_text(html: str) -> tuple[str, str]:
    """``(title, text)`` of an HTML document."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    return _squeeze(" ".join(parser.title)), _squeeze("".join(parser.parts), keep_lines=True)


def _squeeze(text: str, keep_lines: bool = False) -> str:
    if not keep_lines:
        return " ".join(text.split())
    lines = (" ".join(line.split()) for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def page_text(page: FetchedPage, max_chars: int) -> tuple[str, str]:
    """``(title, text)`` of a fetched page, or ``FetchError`` for non-text content."""
    if page.status >= 400:
        raise FetchError(f"the server answered HTTP {page.status}")
    message = Message()
    message["content-type"] = page.content_type or "text/html"
    media = message.get_content_type()
    if not media.startswith(_TEXT_TYPES):
        raise FetchError(f"cannot read content of type {media}")
    charset = message.get_content_charset() or _meta_charset(page.body) or "utf-8"
    try:
        raw = page.body.decode(charset, errors="replace")
    except LookupError:
        raw = page.body.decode("utf-8", errors="replace")
    if media in ("text/html", "application/xhtml+xml"):
        title, text = html_to_text(raw)
    elif media == "application/json":
        title, text = "", _pretty_json(raw)
    else:
        title, text = "", raw.strip()
    if len(text) > max_chars:
        text = text[:max_chars] + "\n[truncated]"
    return title or page.url, text


def _meta_charset(body: bytes) -> str | None:
    match = re.search(rb"<meta[^>]+charset=[\"']?([A-Za-z0-9_-]+)", body[:4096], re.IGNORECASE)
    return match.group(1).decode("ascii") if match else None


def _pretty_json(raw: str) -> str:
    try:
        return json.dumps(json.loads(raw), indent=1, ensure_ascii=False)
    except ValueError:
        return raw.strip()
