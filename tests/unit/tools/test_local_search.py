"""The local web_search provider: pages to an FTS5 index, ranking, hostile queries, seeding."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from serve_app.config import REPO_ROOT
from serve_app.tools.config import WebSearchOptions
from serve_app.tools.local_pages import (
    PageError,
    github_anchor,
    load_documents,
    read_document,
    split_markdown,
)
from serve_app.tools.local_search import (
    LocalSearchIndex,
    LocalSearchProvider,
    default_index_path,
    fts_query,
)
from serve_app.tools.search import SearchError, build_search_provider

BASE = "https://docs.example.com/"

TIDES_HTML = """<!doctype html>
<html><head><title>Why the sea has tides</title>
<style>body {font-family: serif}</style><script>var moon = "not text";</script></head>
<body><nav>Home | Oceans</nav>
<h1>Tides</h1>
<p>Tides are the regular rise and fall of the sea. The Moon's gravity pulls the ocean
toward it on the near side of the Earth, and the Earth is pulled away from the water on the
far side, so most coasts see two high tides and two low tides each lunar day.</p>
<p>The Sun adds a smaller pull: when Sun and Moon line up, spring tides are higher.</p>
</body></html>
"""

CANONICAL_HTML = """<html><head><title>Ocean currents</title>
<link rel="canonical" href="https://oceans.example.org/currents"></head>
<body><p>Currents move water around the globe. Wind drives surface currents; differences in
salt and temperature drive the deep ones. The Moon plays no part in them.</p></body></html>
"""

VOLCANOES_MD = """---
title: Volcanoes
url: https://geo.example.net/volcanoes
---
# Volcanoes

A volcano is an opening in the crust where molten rock reaches the surface.

## Magma and lava

Magma is molten rock underground; once it erupts it is called lava. Basaltic lava is
runny and builds broad shield volcanoes.

```text
## not a heading: this is inside a code fence
```

## Eruptions

Explosive eruptions happen when gas-rich, sticky magma fragments; ash columns can reach the
stratosphere.
"""

BEES_MD = """# Honey bees

Honey bees forage for nectar and pollen. A colony has one queen, thousands of workers and,
in summer, a few hundred drones. Bees tell each other where flowers are with a waggle dance.
"""

NOTES_TXT = "Field notes: the tide table for Brest lists the times of high water."


def write_corpus(root: Path) -> Path:
    site = root / "site"
    (site / "guides").mkdir(parents=True)
    (site / "notes").mkdir()
    (site / ".drafts").mkdir()
    (site / "guides" / "tides.html").write_text(TIDES_HTML)
    (site / "guides" / "currents.html").write_text(CANONICAL_HTML)
    (site / "notes" / "volcanoes.md").write_text(VOLCANOES_MD)
    (site / "notes" / "honey bees.md").write_text(BEES_MD)
    (site / "notes" / "brest.txt").write_text(NOTES_TXT)
    (site / ".drafts" / "secret.html").write_text("<p>tides draft, never indexed</p>")
    (site / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return site


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return write_corpus(tmp_path)


@pytest.fixture
def index(tmp_path: Path, site: Path) -> LocalSearchIndex:
    idx = LocalSearchIndex(tmp_path / "state" / "search" / "index.db")
    report = idx.add_documents(load_documents([site], base_url=BASE, root=None))
    assert (report.added, report.skipped) == (5, 0)
    return idx


def test_pages_get_web_urls_titles_and_text(index: LocalSearchIndex) -> None:
    stats = index.stats()
    assert (stats.pages, stats.sections) == (5, 7)  # volcanoes.md: intro + 2 sections
    tides = index.page(BASE + "guides/tides.html")
    assert tides is not None
    title, text = tides
    assert title == "Why the sea has tides"
    assert "Moon's gravity" in text and "not text" not in text and "font-family" not in text
    # A page's own URL wins over base + path: canonical link, front matter.
    assert index.page("https://oceans.example.org/currents") is not None
    assert index.page(BASE + "guides/currents.html") is None
    volcano = index.page("https://geo.example.net/volcanoes")
    assert volcano is not None and volcano[0] == "Volcanoes"
    assert volcano[1].index("opening in the crust") < volcano[1].index("stratosphere")
    # Paths are percent-encoded; hidden folders and non-page files are not indexed.
    assert index.page(BASE + "notes/honey%20bees.md") == (
        "Honey bees",
        "Honey bees\n\n" + BEES_MD.split("\n\n", 1)[1].strip(),
    )
    assert index.page(BASE + ".drafts/secret.html") is None


def test_markdown_sections_have_github_anchors(index: LocalSearchIndex) -> None:
    section = index.page("https://geo.example.net/volcanoes#magma-and-lava")
    assert section is not None
    assert section[1].startswith("Magma and lava\n") and "shield volcanoes" in section[1]
    assert "not a heading" in section[1]  # a code fence is not a split
    assert index.page("https://geo.example.net/volcanoes#eruptions") is not None
    taken: dict[str, int] = {}
    assert github_anchor("Catalog (`GET /v1/models`)", taken) == "catalog-get-v1models"
    assert github_anchor("6. Mint API keys", taken) == "6-mint-api-keys"
    assert [github_anchor("FAQ", taken) for _ in range(3)] == ["faq", "faq-1", "faq-2"]
    assert [h for h, _ in split_markdown("# T\n\ntext\n\n## A\n\nx\n\n### B\n\ny")] == [None, "A"]


async def test_query_ranks_the_best_page_first(index: LocalSearchIndex) -> None:
    provider = LocalSearchProvider(index, snippet_chars=200)
    hits = await provider.search("why does the moon cause tides", 5)
    assert hits[0].url == BASE + "guides/tides.html"
    assert hits[0].title == "Why the sea has tides"
    assert "Moon" in hits[0].snippet and len(hits[0].snippet) <= 200
    urls = [h.url for h in hits]
    assert "https://oceans.example.org/currents" in urls  # mentions the Moon, ranks lower
    assert BASE + "notes/honey%20bees.md" not in urls
    # A section, not its whole page, answers a question about that section.
    hits = await provider.search("explosive eruptions ash", 3)
    assert hits[0].url == "https://geo.example.net/volcanoes#eruptions"
    assert hits[0].title == "Volcanoes — Eruptions"
    # Stemming: "foraging" finds "forage".
    assert (await provider.search("foraging bees", 1))[0].title == "Honey bees"
    assert len(await provider.search("tides", 1)) == 1


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '"unbalanced tides',
        "*",
        "tides*",
        "NEAR(tides moon",
        "NEAR(tides moon, 2)",
        "-moon",
        "tides -moon",
        "title:tides",
        "tides AND OR NOT",
        "^tides",
        "(tides",
        "'; DROP TABLE pages; --",
        "tides\x00moon",
        "🌊 tides 🌕",
        "{title body}: tides",
        " ".join(["tides"] * 5000),
    ],
)
def test_hostile_queries_never_raise(index: LocalSearchIndex, query: str) -> None:
    hits = index.search(query, 5)
    assert isinstance(hits, list)
    if "tides" in query.casefold() or "moon" in query.casefold():
        assert hits and hits[0].url.startswith("https://")
    assert index.stats().pages == 5  # nothing was dropped


def test_fts_query_quotes_every_term() -> None:
    assert fts_query('NEAR("tides" moon*, 2) -sun') == '"near" OR "tides" OR "moon" OR "2" OR "sun"'
    assert fts_query("How do the tides work?") == '"tides" OR "work"'  # question words dropped
    assert fts_query("how do I") == '"how" OR "do" OR "i"'  # nothing else: kept
    assert fts_query("!!! ??? ***") is None
    assert fts_query(" ".join(f"w{i}" for i in range(100))).count(" OR ") == 31


def test_queries_without_words_and_empty_indexes(tmp_path: Path, index: LocalSearchIndex) -> None:
    assert index.search("!!! ???", 5) == []
    missing = LocalSearchIndex(tmp_path / "nowhere" / "index.db")
    with pytest.raises(SearchError, match="no pages yet"):
        missing.search("tides", 5)
    assert missing.page(BASE + "guides/tides.html") is None
    assert missing.stats().pages == 0
    empty = LocalSearchIndex(tmp_path / "empty.db")
    report = empty.add_documents([])
    assert report.indexed == 0 and empty.path.is_file()
    with pytest.raises(SearchError, match="no pages yet"):
        empty.search("tides", 5)
    not_sqlite = tmp_path / "junk.db"
    not_sqlite.write_bytes(b"this is not a database" * 100)
    with pytest.raises(SearchError, match="could not be read"):
        LocalSearchIndex(not_sqlite).search("tides", 5)
    assert LocalSearchIndex(not_sqlite).page(BASE + "guides/tides.html") is None


def test_an_index_of_another_schema_is_refused_then_rebuilt(
    index: LocalSearchIndex, site: Path
) -> None:
    with sqlite3.connect(index.path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(SearchError, match="another gateway version"):
        index.search("tides", 5)
    assert index.page(BASE + "guides/tides.html") is None
    report = index.add_documents(load_documents([site / "guides"], base_url=BASE, root=None))
    assert report.added == 2 and index.stats().pages == 2  # rebuilt from scratch
    assert index.search("tides", 1)[0].url == BASE + "tides.html"


def test_reindex_updates_changed_pages_and_drops_gone_sections(
    index: LocalSearchIndex, site: Path
) -> None:
    volcanoes = site / "notes" / "volcanoes.md"
    volcanoes.write_text(VOLCANOES_MD.split("## Eruptions")[0] + "## Calderas\n\nA caldera.\n")
    (site / "guides" / "tides.html").write_text(TIDES_HTML.replace("spring tides", "king tides"))
    report = index.add_documents(load_documents([site], base_url=BASE, root=None))
    assert (report.added, report.updated, report.unchanged) == (0, 2, 3)
    assert index.page("https://geo.example.net/volcanoes#eruptions") is None
    assert index.search("caldera", 1)[0].url == "https://geo.example.net/volcanoes#calderas"
    assert index.search("stratosphere", 5) == []
    assert index.search("king", 1)[0].url == BASE + "guides/tides.html"
    # --replace with nothing to index keeps the old index instead of emptying it.
    report = index.add_documents([PageError("x: no URL")], replace=True)
    assert report.skipped == 1 and index.stats().pages == 5
    assert index.remove(["https://geo.example.net/volcanoes"]) == 3
    assert index.stats().pages == 4


def test_pages_without_a_url_are_skipped(tmp_path: Path, site: Path) -> None:
    documents = list(load_documents([site], base_url=None, root=None))
    skipped = [d for d in documents if isinstance(d, PageError)]
    # Only the two that name their own URL (canonical link, front matter) have one.
    assert len(documents) == 5 and len(skipped) == 3
    assert all("no URL" in str(d) for d in skipped)
    with pytest.raises(PageError, match="not a page type"):
        read_document(site / "logo.png", "logo.png", BASE)


def test_root_keeps_folders_in_urls(tmp_path: Path, site: Path) -> None:
    docs = list(load_documents([site / "notes"], base_url=BASE, root=site))
    assert {d.url for d in docs if not isinstance(d, PageError)} == {
        "https://geo.example.net/volcanoes",
        BASE + "notes/honey%20bees.md",
        BASE + "notes/brest.txt",
    }


async def test_searches_run_concurrently_with_a_reindex(
    index: LocalSearchIndex, site: Path
) -> None:
    """Each query has its own read-only connection in a worker thread; a writer holding
    its transaction does not break readers (they see the committed index)."""
    provider = LocalSearchProvider(index)
    stop = threading.Event()

    def reindex() -> None:
        while not stop.is_set():
            index.add_documents(load_documents([site], base_url=BASE, root=None), replace=True)

    writer = threading.Thread(target=reindex)
    writer.start()
    try:
        results = await asyncio.gather(*(provider.search("moon tides", 3) for _ in range(40)))
    finally:
        stop.set()
        writer.join()
    assert all(r and r[0].url == BASE + "guides/tides.html" for r in results)


def test_seed_indexes_only_an_empty_index(tmp_path: Path, site: Path) -> None:
    state = tmp_path / "state"
    options = WebSearchOptions.model_validate(
        {
            "provider": "local",
            "local": {"seed_paths": [str(site / "guides")], "seed_base_url": BASE},
        }
    )
    provider = build_search_provider(options, state, REPO_ROOT)
    assert isinstance(provider, LocalSearchProvider)
    assert provider.index.path == default_index_path(state)
    seeded = provider.index.stats()
    assert seeded.pages == 2
    # The seed's URL paths are relative to the repository root, so outside it: the folder's.
    assert provider.index.page(BASE + "tides.html") is not None
    other = WebSearchOptions.model_validate(
        {"provider": "local", "local": {"seed_paths": [str(site)], "seed_base_url": BASE}}
    )
    build_search_provider(other, state, REPO_ROOT)  # the index has pages: the seed is not added
    assert provider.index.stats().pages == 2


def test_local_provider_options_are_checked() -> None:
    with pytest.raises(ValidationError, match="seed_base_url is required"):
        WebSearchOptions.model_validate({"provider": "local", "local": {"seed_paths": ["docs"]}})
    with pytest.raises(ValidationError, match="http"):
        WebSearchOptions.model_validate(
            {"provider": "local", "local": {"seed_paths": ["d"], "seed_base_url": "file:///x"}}
        )
    with pytest.raises(ValueError, match="index_path"):
        build_search_provider(WebSearchOptions(provider="local"), None, REPO_ROOT)


def test_repository_docs_seed_the_embedded_default(tmp_path: Path) -> None:
    """configs/local.yaml's seed: the repository's own docs, one row per section."""
    config = yaml.safe_load((REPO_ROOT / "configs" / "local.yaml").read_text())
    tools = config["applications"][0]["args"]["tools"]
    options = WebSearchOptions.model_validate(tools["web_search"])
    assert options.provider == "local"
    provider = build_search_provider(options, tmp_path, REPO_ROOT)
    assert isinstance(provider, LocalSearchProvider)
    stats = provider.index.stats()
    assert stats.pages >= 3 and stats.sections > stats.pages
    hits = provider.index.search("bubblewrap sandbox for code_interpreter", 3)
    assert hits and all(h.url.startswith(options.local.seed_base_url or "-") for h in hits)
    assert sqlite3.connect(provider.index.path).execute("PRAGMA integrity_check").fetchone() == (
        "ok",
    )
