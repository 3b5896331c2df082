"""``web_search`` behind one small interface, with real HTTP providers.

The loop only needs ``search(query, count) -> hits``, so a provider is a class
with that method. ``local`` (``local_search.py``) reads a SQLite FTS5 index on
this machine, for a gateway without internet access. Two speak real public
APIs: SearXNG's JSON API (self-hosted metasearch:
``GET {url}/search?q=...&format=json``) and the Brave Search API
(``X-Subscription-Token``). The provider URL is operator configuration, not
model input, so it is called directly (no SSRF guard); the key comes from the
environment variable the config names. Tests point the SearXNG provider at a
loopback server they start themselves: the same code path as production.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from serve_app.tools import local_search
from serve_app.tools.config import WebSearchOptions
from serve_app.tools.search_provider import (
    DisabledSearchProvider,
    SearchError,
    SearchHit,
    SearchProvider,
)

__all__ = [
    "BraveProvider",
    "DisabledSearchProvider",
    "SearchError",
    "SearchHit",
    "SearchProvider",
    "SearxngProvider",
    "build_search_provider",
]


class _HttpProvider:
    def __init__(self, options: WebSearchOptions, environ: Mapping[str, str] | None = None) -> None:
        """``environ``: where ``api_key_env`` is looked up (the process environment)."""
        if not options.url:
            raise ValueError(f"tools.web_search.url is required for provider {options.provider}")
        self.url = options.url.rstrip("/")
        self.timeout_s = options.timeout_s
        self.snippet_chars = options.snippet_chars
        env = os.environ if environ is None else environ
        self.api_key = env.get(options.api_key_env, "") if options.api_key_env else ""

    async def _get_json(self, url: str, params: dict[str, Any], headers: dict[str, str]) -> Any:
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, trust_env=False) as client:
                response = await client.get(url, params=params, headers=headers)
        except httpx.HTTPError as err:
            raise SearchError(
                f"the search provider is unreachable ({type(err).__name__})"
            ) from None
        if response.status_code != 200:
            raise SearchError(f"the search provider answered HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise SearchError("the search provider answered with invalid JSON") from None

    def _hits(self, rows: Any, snippet_key: str, count: int) -> list[SearchHit]:
        hits: list[SearchHit] = []
        for row in rows if isinstance(rows, list) else []:
            if not isinstance(row, dict) or not isinstance(row.get("url"), str):
                continue
            if not row["url"].startswith(("http://", "https://")):
                continue
            snippet = str(row.get(snippet_key) or "")[: self.snippet_chars]
            hits.append(SearchHit(str(row.get("title") or row["url"]), row["url"], snippet))
            if len(hits) >= count:
                break
        return hits


class SearxngProvider(_HttpProvider):
    """A SearXNG instance with the ``json`` output format enabled."""

    async def search(self, query: str, count: int) -> list[SearchHit]:
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = await self._get_json(
            f"{self.url}/search", {"q": query, "format": "json"}, headers=headers
        )
        rows = data.get("results") if isinstance(data, dict) else None
        return self._hits(rows, "content", count)


class BraveProvider(_HttpProvider):
    """The Brave Search web endpoint (``url`` is the full endpoint URL)."""

    async def search(self, query: str, count: int) -> list[SearchHit]:
        headers = {"Accept": "application/json", "X-Subscription-Token": self.api_key}
        data = await self._get_json(self.url, {"q": query, "count": count}, headers=headers)
        web = data.get("web") if isinstance(data, dict) else None
        rows = web.get("results") if isinstance(web, dict) else None
        return self._hits(rows, "description", count)


def build_search_provider(
    options: WebSearchOptions, state_dir: Path | None, seed_root: Path
) -> SearchProvider:
    """The configured provider; ``state_dir`` locates the ``local`` index by default.

    ``seed_root`` is what relative ``seed_paths`` and the seeded pages' URL paths are
    relative to: the repository root, handed down by the composition root
    (``serve_app.config.REPO_ROOT``) so the tool backends never reach up to the config.

    ``local`` seeds its index here (in the replica, before it serves) when
    ``seed_paths`` is set and the index is empty, so the embedded default has
    pages to search on first start whatever command started it.
    """
    if options.provider == "searxng":
        return SearxngProvider(options)
    if options.provider == "brave":
        return BraveProvider(options)
    if options.provider == "local":
        return _local_provider(options, state_dir, seed_root)
    return DisabledSearchProvider()


def _local_provider(
    options: WebSearchOptions, state_dir: Path | None, seed_root: Path
) -> SearchProvider:
    local = options.local
    if local.index_path:
        path = Path(local.index_path).expanduser()
    elif state_dir is not None:
        path = local_search.default_index_path(state_dir)
    else:
        raise ValueError("tools.web_search.local.index_path is required without a state dir")
    index = local_search.LocalSearchIndex(path)
    if local.seed_paths and local.seed_base_url:  # the config requires both together
        seeds = [p if p.is_absolute() else seed_root / p for p in map(Path, local.seed_paths)]
        local_search.seed_index(index, seeds, local.seed_base_url, seed_root)
    return local_search.LocalSearchProvider(index, options.snippet_chars)
