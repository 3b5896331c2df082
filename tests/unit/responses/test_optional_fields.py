"""The optional fields agent frameworks send on /v1/responses (docs/api.md, "Responses and
server tools"): each honoured, accepted and named as ignored, or refused."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.gateway import CATALOG, GatewayHarness, HarnessFactory
from tests.fixtures.open_responses import Conformance, parse_sse
from tests.fixtures.tool_servers import LocalWeb, script, tool_args

LOGPROBS = "message.output_text.logprobs"
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


async def post(gw: GatewayHarness, body: dict[str, Any], key: str = "user") -> Any:
    async with gw.client(gw.keys[key]) as http:
        return await http.post(
            "/v1/responses", json={"model": "scripted-chat", "input": "one two", **body}
        )


@pytest.fixture
async def logprob_gateway(make_gateway: HarnessFactory, local_web: LocalWeb) -> GatewayHarness:
    """``scripted-tools`` relaying ``logprobs`` to its engine (vLLM heads do), server tools
    against the loopback search, and ``keys["tools"]`` entitled to them."""
    catalog = [dict(entry) for entry in CATALOG]
    for entry in catalog:
        if entry["id"] == "scripted-tools":
            config = {"max_model_len": 4096, "extra_params": ["logprobs", "top_logprobs"]}
            entry["engine"] = {"backend": "scripted", "config": config}
    harness = await make_gateway({**tool_args(local_web), "catalog": catalog})
    harness.keys["tools"] = harness.store.create_key("toolie", "acme")
    harness.store.update_user("toolie", web_search=True)
    return harness


async def test_what_the_agents_sdk_and_langchain_send_is_accepted(
    gateway: GatewayHarness,
) -> None:
    """The defaults (``include: []``), and values that apply as sent: no header."""
    body = {
        "include": [],
        "truncation": "disabled",
        "service_tier": "auto",
        "safety_identifier": "user-42",
        "store": False,
        "metadata": {"agent": "triage"},
        "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "background": False,
    }
    resp = await post(gateway, body)
    assert resp.status_code == 200, resp.text
    assert "x-service-ignored-params" not in resp.headers
    response = resp.json()
    Conformance().response(response)
    assert response["truncation"] == "disabled" and response["service_tier"] == "default"
    assert response["metadata"] == {"agent": "triage"}


async def test_hints_the_gateway_cannot_apply_are_named(gateway: GatewayHarness) -> None:
    body = {
        "truncation": "auto",
        "service_tier": "flex",
        "prompt_cache_key": "session-1",
        "text": {"verbosity": "low"},
        "top_logprobs": 3,  # without the include value: nothing to return them in
    }
    resp = await post(gateway, body)
    assert resp.status_code == 200, resp.text
    named = [name.strip() for name in resp.headers["x-service-ignored-params"].split(",")]
    assert sorted(named) == sorted(
        ["truncation", "service_tier", "prompt_cache_key", "text.verbosity", "top_logprobs"]
    )
    response = resp.json()
    Conformance().response(response)
    assert response["truncation"] == "disabled" and response["service_tier"] == "default"
    assert response["prompt_cache_key"] is None and response["top_logprobs"] == 0


async def test_reasoning_summary_is_accepted_and_named(gateway: GatewayHarness) -> None:
    body = {"model": "scripted-reasoner", "reasoning": {"effort": "low", "summary": "auto"}}
    resp = await post(gateway, body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-service-ignored-params"] == "reasoning.summary"
    response = resp.json()
    reasoning = next(i for i in response["output"] if i["type"] == "reasoning")
    assert reasoning["summary"] == []  # never written
    assert response["reasoning"] == {"effort": "low", "summary": None}


async def test_penalties_reach_the_engine_and_are_stated(gateway: GatewayHarness) -> None:
    resp = await post(gateway, {"presence_penalty": 0.5, "frequency_penalty": -0.25})
    assert resp.status_code == 200, resp.text
    _, sampling = gateway.engines["scripted-chat"].seen[-1]
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -0.25)
    response = resp.json()
    assert (response["presence_penalty"], response["frequency_penalty"]) == (0.5, -0.25)


@pytest.mark.parametrize("tools", [None, [WEATHER]], ids=["live", "held-turn"])
async def test_include_logprobs_fills_events_and_the_part(
    logprob_gateway: GatewayHarness, tools: list[dict[str, Any]] | None
) -> None:
    body: dict[str, Any] = {
        "model": "scripted-tools",
        "input": "alpha beta",
        "include": [LOGPROBS],
        "top_logprobs": 2,
        "stream": True,
    }
    if tools:
        body["tools"] = tools
    resp = await post(logprob_gateway, body, key="tools")
    assert resp.status_code == 200, resp.text
    events = parse_sse(resp.text)
    Conformance().stream(events)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["logprobs"][0]["token"] for d in deltas] == ["alpha", " beta"]
    assert all(len(d["logprobs"][0]["top_logprobs"]) == 2 for d in deltas)
    final = events[-1]["response"]
    (part,) = final["output"][-1]["content"]
    assert [p["token"] for p in part["logprobs"]] == ["alpha", " beta"]
    assert final["top_logprobs"] == 2
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == part["logprobs"]
    _, sampling = logprob_gateway.engines["scripted-tools"].seen[-1]
    assert sampling.extra == {"logprobs": True, "top_logprobs": 2}


async def test_without_include_no_logprobs_are_asked(logprob_gateway: GatewayHarness) -> None:
    resp = await post(logprob_gateway, {"model": "scripted-tools", "input": "a b"}, key="tools")
    body = resp.json()
    assert "logprobs" not in body["output"][0]["content"][0]
    _, sampling = logprob_gateway.engines["scripted-tools"].seen[-1]
    assert "logprobs" not in sampling.extra


async def test_include_action_sources_lists_each_search_results(
    logprob_gateway: GatewayHarness, local_web: LocalWeb
) -> None:
    turns = script({"call": "web_search", "arguments": {"query": "lyon"}}, {"reply": "Done [1]."})
    body = {"model": "scripted-tools", "input": turns, "tools": [{"type": "web_search"}]}
    plain = (await post(logprob_gateway, body, key="tools")).json()
    assert "sources" not in plain["output"][0]["action"]
    resp = await post(
        logprob_gateway,
        {**body, "include": ["web_search_call.action.sources", "code_interpreter_call.outputs"]},
        key="tools",
    )
    assert resp.status_code == 200, resp.text
    search = resp.json()["output"][0]
    assert search["type"] == "web_search_call"
    urls = [s["url"] for s in search["action"]["sources"]]
    assert urls and all(u.startswith(f"{local_web.base_url}/page/") for u in urls)
    assert {s["type"] for s in search["action"]["sources"]} == {"url"}


async def test_text_format_json_schema_reaches_the_head_as_response_format(
    make_gateway: HarnessFactory,
) -> None:
    """With the operator's switch on, a vLLM head decodes it with a grammar (chat's
    ``response_format``, a field vLLM's request knows: the scripted head is told to take it)."""
    catalog = [dict(entry) for entry in CATALOG]
    (chat,) = (entry for entry in catalog if entry["id"] == "scripted-chat")
    chat["engine"] = {"backend": "vllm", "config": {"extra_params": ["response_format"]}}
    gateway = await make_gateway(
        {"catalog": catalog, "responses": {"structured_text_formats": True}}
    )
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    fmt = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
    resp = await post(gateway, {"text": {"format": fmt}})
    assert resp.status_code == 200, resp.text
    assert "x-service-ignored-params" not in resp.headers
    _, sampling = gateway.engines["scripted-chat"].seen[-1]
    assert sampling.extra == {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        }
    }
    assert resp.json()["text"] == {
        "format": {**fmt, "description": None},
    }
    resp = await post(gateway, {"text": {"format": {"type": "json_object"}}})
    assert resp.json()["text"] == {"format": {"type": "json_object"}}
    _, sampling = gateway.engines["scripted-chat"].seen[-1]
    assert sampling.extra == {"response_format": {"type": "json_object"}}
