"""Typed settings of the server tools (the ``tools:`` block of the Serve config args).

Secrets never live here: the search provider's API key is read from the
environment variable named by ``api_key_env``, like external model providers.
Everything is ``extra="forbid"`` so a typo fails ``serve deploy``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.contract.sandbox import CodeInterpreterOptions


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalSearchOptions(_Strict):
    """The ``local`` provider: a SQLite FTS5 index of pages on this machine (no internet).

    Operators fill the index with ``gateway search index``; ``seed_paths`` only
    gives a fresh install something to search (indexed when the index is empty).
    """

    index_path: str | None = Field(
        default=None,
        description="SQLite file of the index; default GATEWAY_STATE_DIR/search/index.db "
        "(the file `gateway search index` writes by default).",
    )
    seed_paths: list[str] = Field(
        default_factory=list,
        description="Files or folders (relative paths: from the repository root) indexed by "
        "a gateway replica at start when the index holds no page yet.",
    )
    seed_base_url: str | None = Field(
        default=None,
        description="URL prefix of seeded pages: base + path relative to the repository "
        "root, unless a page names its own URL (canonical link, front matter).",
    )
    serve_fetches: bool = Field(
        default=True,
        description="web_fetch of a URL the index holds reads the indexed text instead of "
        "the network, so a search result can be opened without internet access.",
    )

    @model_validator(mode="after")
    def _seed_needs_urls(self) -> LocalSearchOptions:
        if self.seed_paths and not self.seed_base_url:
            raise ValueError("seed_base_url is required with seed_paths (pages need web URLs)")
        url = self.seed_base_url
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"seed_base_url must be an http(s) URL, got {url!r}")
        return self


class WebSearchOptions(_Strict):
    """Where ``web_search`` sends queries."""

    provider: Literal["none", "local", "searxng", "brave"] = Field(
        default="none",
        description="none: every search fails (tool unavailable); local: the SQLite FTS5 "
        "index on this machine (see `local`); searxng: a SearXNG instance's JSON API "
        "(GET {url}/search?format=json); brave: the Brave Search API.",
    )
    local: LocalSearchOptions = Field(
        default_factory=LocalSearchOptions, description="Settings of provider: local."
    )
    url: str | None = Field(
        default=None,
        description="Base URL of the provider (SearXNG instance root, or the Brave endpoint "
        "https://api.search.brave.com/res/v1/web/search).",
    )
    api_key_env: str | None = Field(
        default=None, description="Environment variable holding the provider's API key."
    )
    timeout_s: float = Field(default=10.0, gt=0, description="Per search request.")
    price_per_search: float = Field(
        default=0.0, ge=0, description="Published in the chat answer's web_search object."
    )
    snippet_chars: int = Field(
        default=400, ge=50, description="Longest snippet per result handed to the model."
    )


class WebFetchOptions(_Strict):
    """Limits of ``web_fetch`` (hostile-input rules, like remote images)."""

    timeout_s: float = Field(default=10.0, gt=0, description="Whole fetch, redirects included.")
    max_bytes: int = Field(default=2 * 1024 * 1024, ge=1024, description="Largest body read.")
    max_chars: int = Field(
        default=12_000, ge=200, description="Longest page text handed to the model."
    )
    max_redirects: int = Field(default=3, ge=0, description="Redirect hops, each re-checked.")
    allow_private_hosts: bool = Field(
        default=False,
        description="Allow loopback/private/link-local targets. Tests only: it disables "
        "the SSRF guard.",
    )


class ToolsOptions(_Strict):
    """The three server tools."""

    web_search: WebSearchOptions = Field(default_factory=WebSearchOptions)
    web_fetch: WebFetchOptions = Field(default_factory=WebFetchOptions)
    code_interpreter: CodeInterpreterOptions = Field(default_factory=CodeInterpreterOptions)
