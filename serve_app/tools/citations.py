"""Numbered sources and the ``url_citation`` annotations built from ``[n]`` markers.

Every search result and fetched page gets a number the first time its URL is
seen in a request (the same URL keeps its number), and the model is asked to
cite with ``[n]``. After the answer, each marker naming a known source becomes
an annotation: ``index`` (the number, authoritative) and a best-effort span of
the marker in the text (``start_index``/``end_index``, Unicode code points).
Sources the model never cited are still listed, with an empty span at the end
of the text (docs/reference/responses.md#citations), so a client can show every source
consulted.

A marker naming no source of the request (a model citing before any search ran, or
past the last result) is removed from the answer by ``drop_unbacked``: an answer
never shows a citation with nothing behind it. Code (fenced or inline) is left as
written, where ``a[1]`` is an index, not a citation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from serve_app.protocol.responses import UrlCitation

_MARKER = re.compile(r"\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]")
_CODE = re.compile(r"```.*?(?:```|$)|`[^`\n]*`", re.DOTALL)
_UNBACKED = re.compile(r"[ \t]*\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]")


@dataclass(frozen=True)
class Source:
    index: int
    url: str
    title: str


@dataclass(frozen=True)
class Citation:
    source: Source
    start_index: int
    end_index: int

    def for_responses(self) -> UrlCitation:
        return {
            "type": "url_citation",
            "url": self.source.url,
            "title": self.source.title,
            "index": self.source.index,
            "start_index": self.start_index,
            "end_index": self.end_index,
        }

    def for_chat(self) -> dict[str, Any]:
        return {
            "type": "url_citation",
            "url_citation": {
                "index": self.source.index,
                "title": self.source.title,
                "url": self.source.url,
                "start_index": self.start_index,
                "end_index": self.end_index,
            },
        }


class SourceList:
    """The sources of one request, numbered from 1 in order of first appearance."""

    def __init__(self) -> None:
        self._by_url: dict[str, Source] = {}

    def __len__(self) -> int:
        return len(self._by_url)

    def numbers(self) -> set[int]:
        return {source.index for source in self._by_url.values()}

    def add(self, url: str, title: str) -> Source:
        source = self._by_url.get(url)
        if source is None:
            source = Source(len(self._by_url) + 1, url, title or url)
            self._by_url[url] = source
        return source

    def citations(self, text: str) -> list[Citation]:
        """Cited sources in order of their markers, then the uncited ones at the end."""
        by_index = {s.index: s for s in self._by_url.values()}
        found: list[Citation] = []
        cited: set[int] = set()
        for match in _MARKER.finditer(text):
            for number in match.group(1).split(","):
                source = by_index.get(int(number))
                if source is not None:
                    found.append(Citation(source, match.start(), match.end()))
                    cited.add(source.index)
        end = len(text)
        found.extend(Citation(s, end, end) for s in self._by_url.values() if s.index not in cited)
        return found


def drop_unbacked(text: str, sources: SourceList) -> str:
    """``text`` without the ``[n]`` markers (or the numbers of a ``[n, m]``) that name no
    source of ``sources``; code spans are kept as they are."""
    known = sources.numbers()

    def clean(match: re.Match[str]) -> str:
        numbers = [n.strip() for n in match.group(1).split(",")]
        kept = [n for n in numbers if int(n) in known]
        if len(kept) == len(numbers):
            return match.group(0)
        if not kept:
            return ""
        return match.group(0)[: match.start(1) - match.start()] + ", ".join(kept) + "]"

    out, last = [], 0
    for code in _CODE.finditer(text):
        out.append(_UNBACKED.sub(clean, text[last : code.start()]))
        out.append(code.group(0))
        last = code.end()
    out.append(_UNBACKED.sub(clean, text[last:]))
    return "".join(out)
