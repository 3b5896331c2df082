"""What every ``web_search`` provider implements, and what it returns or raises.

Below ``search.py`` (the HTTP providers and the factory) and ``local_search.py``
(the SQLite index), which both build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class SearchError(Exception):
    """The search did not run; the message is safe to show the model."""


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str


class SearchProvider(Protocol):
    async def search(self, query: str, count: int) -> list[SearchHit]: ...


class DisabledSearchProvider:
    """No provider configured: every search fails (a failed item, never a failed request)."""

    async def search(self, query: str, count: int) -> list[SearchHit]:
        raise SearchError("web search is not configured on this gateway")
