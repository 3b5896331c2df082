"""An answer on a request declaring web_search never shows a ``[n]`` with no source behind it:
the guidance says how to cite only with the results, and unbacked markers are removed."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.tools.citations import SourceList, drop_unbacked
from serve_app.tools.guidance import CITATION_RULE, NO_SOURCES
from tests.fixtures.gateway import GatewayHarness
from tests.fixtures.tool_servers import LocalWeb, script


def sources(n: int) -> SourceList:
    found = SourceList()
    for i in range(1, n + 1):
        found.add(f"https://s{i}.example/", f"S{i}")
    return found


@pytest.mark.parametrize(
    ("text", "known", "expected"),
    [
        ("[1]", 0, ""),
        ("Lyon has 520,000 people [1].", 0, "Lyon has 520,000 people."),
        ("Lyon [1][2].", 1, "Lyon [1]."),
        ("Lyon [1, 3].", 2, "Lyon [1]."),
        ("Lyon [1, 2].", 2, "Lyon [1, 2]."),
        ("Use `xs[1]` or\n```py\nys[2]\n```\nsee [3]", 0, "Use `xs[1]` or\n```py\nys[2]\n```\nsee"),
        ("no markers at all", 0, "no markers at all"),
    ],
)
def test_drop_unbacked(text: str, known: int, expected: str) -> None:
    assert drop_unbacked(text, sources(known)) == expected


async def chat(gw: GatewayHarness, content: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    body = {
        "model": "scripted-tools",
        "messages": [{"role": "user", "content": content}],
        "tools": tools,
    }
    async with gw.client(gw.keys["tools"]) as http:
        resp = await http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


async def test_a_marker_without_a_search_is_removed(tool_gateway: GatewayHarness) -> None:
    body = await chat(
        tool_gateway,
        script({"reply": "Lyon has 4.8 million people [1]."}),
        [{"type": "web_search"}],
    )
    message = body["choices"][0]["message"]
    assert message["content"] == "Lyon has 4.8 million people."
    assert message["annotations"] == []


async def test_markers_past_the_results_are_removed_the_rest_annotated(
    tool_gateway: GatewayHarness, local_web: LocalWeb
) -> None:
    turns = script(
        {"call": "web_search", "arguments": {"query": "lyon"}},
        {"reply": "Lyon is big [1][9]."},
    )
    async with tool_gateway.client(tool_gateway.keys["tools"]) as http:
        resp = await http.post(
            "/v1/responses",
            json={
                "model": "scripted-tools",
                "input": turns,
                "tools": [{"type": "web_search", "search_context_size": "low"}],
            },
        )
    body = resp.json()
    (part,) = body["output"][-1]["content"]
    assert part["text"] == "Lyon is big [1]."
    cited = [a for a in part["annotations"] if a["start_index"] != a["end_index"]]
    assert [(a["index"], part["text"][a["start_index"] : a["end_index"]]) for a in cited] == [
        (1, "[1]")
    ]
    # what the model read: the numbered results, closed by how to cite them
    seen, _ = tool_gateway.engines["scripted-tools"].seen[-1]
    assert seen is not None and seen.messages is not None
    result = seen.messages[-1]
    assert result["role"] == "tool" and result["content"].startswith("[1] Result 1")
    assert result["content"].endswith(CITATION_RULE)


async def test_no_results_tell_the_model_there_is_nothing_to_cite(
    tool_gateway: GatewayHarness, local_web: LocalWeb
) -> None:
    local_web.no_results()
    turns = script({"call": "web_search", "arguments": {"query": "x"}}, {"reply": "None."})
    await chat(tool_gateway, turns, [{"type": "web_search"}])
    seen, _ = tool_gateway.engines["scripted-tools"].seen[-1]
    assert seen is not None and seen.messages is not None
    assert seen.messages[-1]["content"] == NO_SOURCES
