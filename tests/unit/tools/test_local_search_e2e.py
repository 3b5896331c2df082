"""The local provider through the gateway: ``gateway search`` builds the index, the server-tool
loop searches it, and its pages come back as ``url_citation`` annotations on chat and responses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from serve_app.cli import main
from serve_app.config import REPO_ROOT
from serve_app.settings import GatewaySettings
from serve_app.tools.local_search import default_index_path
from tests.fixtures.gateway import GatewayHarness, HarnessFactory
from tests.fixtures.tool_servers import script
from tests.unit.tools.test_local_search import BASE, write_corpus

TIDES_URL = BASE + "guides/tides.html"
TIDES_TITLE = "Why the sea has tides"


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def indexed(tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The corpus indexed with the CLI into the state folder's default index."""
    site = write_corpus(tmp_path)
    rc = main(["search", "index", str(site), "--base-url", BASE, "--state-dir", str(state_dir)])
    assert rc == 0
    out, err = capsys.readouterr()
    assert "files: 5 added, 0 updated, 0 unchanged, 0 skipped" in out
    assert f"added      {TIDES_URL}" in err  # one progress line per file
    return default_index_path(state_dir)


def settings_for(state_dir: Path) -> GatewaySettings:
    return GatewaySettings(state_dir=state_dir, database_url="sqlite://")


def test_cli_query_stats_remove(
    indexed: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_for(state_dir)
    assert main(["search", "query", "moon", "tides", "-n", "2"], settings=settings) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"[1] {TIDES_TITLE}\n    {TIDES_URL}\n")
    assert "[3]" not in out
    assert main(["search", "query", '"* ( -', "-n", "2"], settings=settings) == 0
    assert capsys.readouterr().out == "No results.\n"
    assert main(["search", "stats", "--index", str(indexed)]) == 0
    out = capsys.readouterr().out
    assert "pages:        5" in out and "sections:     7" in out
    assert main(["search", "remove", TIDES_URL], settings=settings) == 0
    assert main(["search", "remove", TIDES_URL], settings=settings) == 1  # already gone
    capsys.readouterr()
    assert main(["search", "query", "spring", "tides"], settings=settings) == 0
    assert TIDES_URL not in capsys.readouterr().out


def test_cli_refuses_what_it_cannot_index(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_for(state_dir)
    site = write_corpus(tmp_path)
    assert main(["search", "index", str(site / "guides" / "tides.html")], settings=settings) == 1
    err = capsys.readouterr().err
    assert "no URL" in err and "hint: pages without their own URL need --base-url" in err
    assert "error: no page was indexed" in err
    args = ["search", "index", str(site), "--base-url", "file:///srv/site"]
    assert main(args, settings=settings) == 1
    assert "http(s)" in capsys.readouterr().err
    assert main(["search", "index", str(tmp_path / "missing")], settings=settings) == 1
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["search", "query", "tides"], settings=settings) == 1
    assert "no pages yet" in capsys.readouterr().err
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 200)
    assert main(["search", "stats", "--index", str(junk)]) == 1
    assert "error: search index: file is not a database" in capsys.readouterr().err
    for argv in (["search", "--help"], ["search", "index", "--help"], ["search", "query", "-h"]):
        assert main(argv) == 0
    assert "--base-url" in capsys.readouterr().out


def local_tools(index: Path, **local: Any) -> dict[str, Any]:
    return {
        "tools": {
            "web_search": {
                "provider": "local",
                "price_per_search": 0.01,
                "local": {"index_path": str(index), **local},
            },
            # The guard stays on: a fetch that reaches the network would fail here.
            "web_fetch": {"timeout_s": 5.0},
        }
    }


async def local_gateway(make_gateway: HarnessFactory, index: Path, **local: Any) -> GatewayHarness:
    harness = await make_gateway(local_tools(index, **local))
    harness.keys["tools"] = harness.store.create_key("toolie", "acme")
    harness.store.update_user("toolie", web_search=True, web_fetch=True, code_interpreter=True)
    return harness


SEARCH_TIDES = script(
    {"call": "web_search", "arguments": {"query": "why does the moon cause tides"}},
    {"reply": "The Moon's gravity raises the tides [1]."},
)


def tool_message(gw: GatewayHarness) -> str:
    """What the model read back from the tool (the last tool message of the last turn)."""
    prompt, _ = gw.engines["scripted-tools"].seen[-1]
    assert prompt is not None and prompt.messages is not None
    return str([m for m in prompt.messages if m.get("role") == "tool"][-1]["content"])


async def test_chat_cites_the_local_page(make_gateway: HarnessFactory, indexed: Path) -> None:
    gw = await local_gateway(make_gateway, indexed)
    async with gw.client(gw.keys["tools"]) as http:
        resp = await http.post(
            "/v1/chat/completions",
            json={
                "model": "scripted-tools",
                "messages": [{"role": "user", "content": SEARCH_TIDES}],
                "tools": [{"type": "web_search"}],
            },
        )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    message = body["choices"][0]["message"]
    assert message["content"] == "The Moon's gravity raises the tides [1]."
    first = message["annotations"][0]["url_citation"]
    text = message["content"]
    assert (first["index"], first["url"], first["title"]) == (1, TIDES_URL, TIDES_TITLE)
    assert text[first["start_index"] : first["end_index"]] == "[1]"
    # Every result consulted is listed; the uncited ones with an empty span at the end.
    assert len(message["annotations"]) > 1
    assert all(a["url_citation"]["url"].startswith("https://") for a in message["annotations"])
    assert body["web_search"] == {"searches": 1, "price_per_search": 0.01}
    read = tool_message(gw)
    assert read.startswith(f"[1] {TIDES_TITLE}\nURL: {TIDES_URL}\n")
    assert "gravity" in read
    # Both turns told the model it searches this service's index, not the live web.
    turns = [prompt for prompt, _ in gw.engines["scripted-tools"].seen]
    assert len(turns) == 2
    for prompt in turns:
        assert prompt is not None and prompt.messages and prompt.tools
        system = prompt.messages[0]
        assert system["role"] == "system" and "indexed on this service" in system["content"]
        (search,) = (t["function"] for t in prompt.tools if t["function"]["name"] == "web_search")
        assert "not the live web" in search["description"]


async def test_streamed_chat_carries_the_annotations(
    make_gateway: HarnessFactory, indexed: Path
) -> None:
    gw = await local_gateway(make_gateway, indexed)
    async with gw.client(gw.keys["tools"]) as http:
        resp = await http.post(
            "/v1/chat/completions",
            json={
                "model": "scripted-tools",
                "messages": [{"role": "user", "content": SEARCH_TIDES}],
                "tools": [{"type": "web_search"}],
                "stream": True,
            },
        )
    chunks = [
        json.loads(block[6:]) for block in resp.text.split("\n\n") if block.startswith("data: {")
    ]
    activity = [c["web_search"] for c in chunks if c["choices"] == []]
    assert activity[0] == {"status": "searching", "query": "why does the moon cause tides"}
    annotations = [
        a for c in chunks if c["choices"] for a in c["choices"][0]["delta"].get("annotations") or []
    ]
    assert annotations[0]["url_citation"]["url"] == TIDES_URL


async def test_responses_cite_the_local_page_and_fetch_it_offline(
    make_gateway: HarnessFactory, indexed: Path
) -> None:
    """Search, then web_fetch of the result: the page comes from the index, not the network
    (the fetch guard is on and docs.example.com is not reachable from a test)."""
    turns = script(
        {"call": "web_search", "arguments": {"query": "explosive eruptions ash"}},
        {"call": "web_fetch", "arguments": {"url": TIDES_URL}},
        {"reply": "Ash columns [1]; tides [3]."},  # [2]: the second search result
    )
    gw = await local_gateway(make_gateway, indexed)
    async with gw.client(gw.keys["tools"]) as http:
        resp = await http.post(
            "/v1/responses",
            json={
                "model": "scripted-tools",
                "input": turns,
                "tools": [{"type": "web_search"}, {"type": "web_fetch"}],
            },
        )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    search, fetch, message = body["output"]
    assert (search["type"], search["status"]) == ("web_search_call", "completed")
    assert (fetch["type"], fetch["status"]) == ("web_fetch_call", "completed")
    assert "Moon's gravity" in tool_message(gw)
    annotations = message["content"][0]["annotations"]
    assert annotations[0] == {
        "type": "url_citation",
        "url": "https://geo.example.net/volcanoes#eruptions",
        "title": "Volcanoes — Eruptions",
        "index": 1,
        "start_index": 12,
        "end_index": 15,
    }
    cited = {a["index"]: a["url"] for a in annotations}
    assert cited == {
        1: "https://geo.example.net/volcanoes#eruptions",
        2: "https://geo.example.net/volcanoes#magma-and-lava",
        3: TIDES_URL,
    }


@pytest.mark.parametrize(("serve_fetches", "status"), [(True, "completed"), (False, "failed")])
async def test_serve_fetches_decides_between_index_and_network(
    make_gateway: HarnessFactory, tmp_path: Path, serve_fetches: bool, status: str
) -> None:
    """Pages indexed under a loopback URL: from the index, web_fetch reads them; sent to the
    network, the SSRF guard refuses the address (so the index really answered)."""
    site = write_corpus(tmp_path)
    index = tmp_path / "loopback.db"
    base = "http://127.0.0.1:9/"
    assert main(["search", "index", str(site), "--base-url", base, "--index", str(index)]) == 0
    turns = script(
        {"call": "web_fetch", "arguments": {"url": base + "guides/tides.html"}},
        {"reply": "Read [1]."},
    )
    gw = await local_gateway(make_gateway, index, serve_fetches=serve_fetches)
    async with gw.client(gw.keys["tools"]) as http:
        resp = await http.post(
            "/v1/responses",
            json={"model": "scripted-tools", "input": turns, "tools": [{"type": "web_fetch"}]},
        )
    assert resp.json()["output"][0]["status"] == status


async def test_an_empty_index_is_a_failed_search_not_a_failed_request(
    make_gateway: HarnessFactory, state_dir: Path
) -> None:
    gw = await local_gateway(make_gateway, default_index_path(state_dir))
    async with gw.client(gw.keys["tools"]) as http:
        resp = await http.post(
            "/v1/chat/completions",
            json={
                "model": "scripted-tools",
                "messages": [{"role": "user", "content": SEARCH_TIDES}],
                "tools": [{"type": "web_search"}],
            },
        )
    assert resp.status_code == 200
    assert "no pages yet" in tool_message(gw)
    # Not billed: the provider did not answer.
    assert resp.json()["web_search"] == {"searches": 0, "price_per_search": 0.01}


async def test_embedded_default_searches_the_repository_docs(
    make_gateway: HarnessFactory,
) -> None:
    """configs/local.yaml as shipped: the replica seeds its empty index with the repository's
    docs at start, and a search on a fresh install finds and cites them."""
    config = yaml.safe_load((REPO_ROOT / "configs" / "local.yaml").read_text())
    tools = config["applications"][0]["args"]["tools"]
    gw = await make_gateway({"tools": tools})
    gw.keys["tools"] = gw.store.create_key("toolie", "acme")
    gw.store.update_user("toolie", web_search=True)
    turns = script(
        {"call": "web_search", "arguments": {"query": "local search provider SQLite FTS5 index"}},
        {"reply": "It is a SQLite index [1]."},
    )
    async with gw.client(gw.keys["tools"]) as http:
        resp = await http.post(
            "/v1/responses",
            json={"model": "scripted-tools", "input": turns, "tools": [{"type": "web_search"}]},
        )
    body = resp.json()
    assert body["output"][0]["status"] == "completed"
    first = body["output"][-1]["content"][0]["annotations"][0]
    assert first["index"] == 1
    assert first["url"].startswith(tools["web_search"]["local"]["seed_base_url"])
    assert "#" in first["url"]  # a section of a Markdown doc
