"""Chat completions with server tools through the real app (docs/reference/chat.md)."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from tests.fixtures.gateway import GatewayHarness
from tests.fixtures.tool_servers import LocalWeb, script
from tests.unit.ingress.test_limits_and_usage import ledger_records

SEARCH_THEN_ANSWER = script(
    {"call": "web_search", "arguments": {"query": "capital of france"}},
    {"reply": "Paris is the capital [1]."},
)


def chat(content: str, tools: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "model": "scripted-tools",
        "messages": [{"role": "user", "content": content}],
        "tools": tools,
        **extra,
    }


def sse(body: str) -> list[Any]:
    out = []
    for block in body.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def post(gw: GatewayHarness, body: dict[str, Any], key: str = "tools") -> Any:
    async with gw.client(gw.keys[key]) as http:
        return await http.post("/v1/chat/completions", json=body)


async def test_non_streamed_answer_with_citations_and_web_search_object(
    tool_gateway: GatewayHarness, local_web: LocalWeb
) -> None:
    resp = await post(tool_gateway, chat(SEARCH_THEN_ANSWER, [{"type": "web_search"}]))
    assert resp.status_code == 200
    body = resp.json()
    message = body["choices"][0]["message"]
    assert message["content"] == "Paris is the capital [1]."
    first = message["annotations"][0]
    assert first["type"] == "url_citation"
    assert first["url_citation"]["index"] == 1
    assert first["url_citation"]["url"] == f"{local_web.base_url}/page/1"
    assert len(message["annotations"]) == 5  # medium: 5 results, 4 of them uncited
    assert body["web_search"] == {"searches": 1, "price_per_search": 0.01}
    assert local_web.searches() == ["capital of france"]
    # Both turns are billed: prompt of turn 2 includes the search results.
    assert body["usage"]["prompt_tokens"] > 100


async def test_stream_has_activity_chunks_one_done_and_annotations(
    tool_gateway: GatewayHarness,
) -> None:
    resp = await post(tool_gateway, chat(SEARCH_THEN_ANSWER, [{"type": "web_search"}], stream=True))
    events = sse(resp.text)
    assert events[-1] == "[DONE]"
    extensions = [e["web_search"] for e in events[:-1] if e["choices"] == []]
    assert extensions[0] == {"status": "searching", "query": "capital of france"}
    dones = [e for e in extensions if e["status"] == "done"]
    assert dones == [{"status": "done", "searches": 1, "price_per_search": 0.01}]
    text = "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"])
    assert text == "Paris is the capital [1]."
    annotated = [
        e for e in events[:-1] if e["choices"] and "annotations" in e["choices"][0]["delta"]
    ]
    assert len(annotated) == 1
    assert annotated[0]["choices"][0]["delta"]["annotations"][0]["url_citation"]["index"] == 1


async def test_done_is_sent_even_when_no_tool_ran(tool_gateway: GatewayHarness) -> None:
    resp = await post(
        tool_gateway,
        chat(script({"reply": "no tools needed"}), [{"type": "web_search"}], stream=True),
    )
    extensions = [e["web_search"] for e in sse(resp.text)[:-1] if e["choices"] == []]
    assert extensions == [{"status": "done", "searches": 0, "price_per_search": 0.01}]
    non_stream = await post(
        tool_gateway, chat(script({"reply": "plain"}), [{"type": "web_search"}])
    )
    assert "web_search" not in non_stream.json()  # only when a search ran


async def test_flag_missing_is_403_and_model_without_tool_calling_is_400(
    tool_gateway: GatewayHarness,
) -> None:
    resp = await post(tool_gateway, chat("hi", [{"type": "web_search"}]), key="user")
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "insufficient_permissions"
    resp = await post(
        tool_gateway, chat("hi", [{"type": "code_interpreter"}], model="scripted-chat")
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "tools"
    resp = await post(
        tool_gateway, {**chat("hi", []), "web_search_options": {}}, key="user"
    )  # the options object is the same switch
    assert resp.status_code == 403


async def test_budget_stops_the_loop(tool_gateway: GatewayHarness, local_web: LocalWeb) -> None:
    """A model that keeps searching: max_uses=2 runs two searches, then it must answer."""
    always_search = script({"call": "web_search", "arguments": {"query": "again"}})
    resp = await post(tool_gateway, chat(always_search, [{"type": "web_search", "max_uses": 2}]))
    assert resp.status_code == 200
    assert local_web.searches() == ["again", "again"]
    assert resp.json()["web_search"]["searches"] == 2


async def test_tool_failure_is_silent(tool_gateway: GatewayHarness, local_web: LocalWeb) -> None:
    local_web.fail_searches(500)
    resp = await post(tool_gateway, chat(SEARCH_THEN_ANSWER, [{"type": "web_search"}]))
    assert resp.status_code == 200
    body = resp.json()
    # no source was found, so the marker the model wrote has nothing behind it: removed
    assert body["choices"][0]["message"]["content"] == "Paris is the capital."
    assert body["choices"][0]["message"]["annotations"] == []
    assert body["web_search"]["searches"] == 0  # a failed search is not billed


async def test_fetch_in_chat_and_ledger_records_searches(
    tool_gateway: GatewayHarness, local_web: LocalWeb
) -> None:
    turns = script(
        {"call": "web_search", "arguments": {"query": "paris"}},
        {"call": "web_fetch", "arguments": {"url": f"{local_web.base_url}/page/9"}},
        {"reply": "See [6]."},
    )
    resp = await post(tool_gateway, chat(turns, [{"type": "web_search"}, {"type": "web_fetch"}]))
    body = resp.json()
    cited = body["choices"][0]["message"]["annotations"][0]["url_citation"]
    assert cited == {
        "index": 6,
        "title": "Paris facts",
        "url": f"{local_web.base_url}/page/9",
        "start_index": 4,
        "end_index": 7,
    }
    record = (await ledger_records(tool_gateway, "toolie"))[body["id"]]
    assert record.web_searches == 1
    assert record.prompt_tokens == body["usage"]["prompt_tokens"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")
async def test_code_interpreter_in_chat(tool_gateway: GatewayHarness) -> None:
    turns = script(
        {"call": "code_interpreter", "arguments": {"code": "print(6 * 7)"}},
        {"reply": "It is 42."},
    )
    resp = await post(tool_gateway, chat(turns, [{"type": "code_interpreter"}], stream=True))
    extensions = [e["web_search"] for e in sse(resp.text)[:-1] if e["choices"] == []]
    assert extensions[0] == {"status": "running_code", "language": "python", "code_chars": 12}
    assert "print" not in json.dumps(extensions)  # the program is not echoed
    assert extensions[-1]["status"] == "done"
    records = await ledger_records(tool_gateway, "toolie")
    assert [r.code_seconds for r in records.values()] == [1.0]  # billed in whole seconds


async def test_n_above_one_is_refused_with_tools(tool_gateway: GatewayHarness) -> None:
    resp = await post(tool_gateway, chat("hi", [{"type": "web_search"}], n=2, temperature=1))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "n"


async def test_client_function_call_ends_the_loop(tool_gateway: GatewayHarness) -> None:
    function = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    turns = script({"call": "get_time", "arguments": {}})
    resp = await post(tool_gateway, chat(turns, [{"type": "web_search"}, function]))
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    seen_tools = tool_gateway.engines["scripted-tools"].seen[-1][0]
    assert seen_tools is not None and seen_tools.tools is not None
    assert [t["function"]["name"] for t in seen_tools.tools] == ["get_time", "web_search"]
    system = (seen_tools.messages or [])[0]
    assert system["role"] == "system" and "Call web_search when" in system["content"]
    assert "look things up on the web" in system["content"]  # a SearXNG provider: the web
