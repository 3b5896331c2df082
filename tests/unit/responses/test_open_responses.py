"""Every ``/v1/responses`` body and stream event validates against Open Responses (issue 19).

One run over the compliance tester's cases and the route's own edges, on the
in-process gateway with scripted engines: plain text, streamed text, truncated,
system + multi-turn, image input, client function calls (whole and streamed in
fragments), a server-tool run, a reasoning model, and an upstream failure after
the response started. Strict JSON mode, core models of ``openresponses-types``;
the route's documented extensions are checked by ``open_responses.Conformance``.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

from PIL import Image

from tests.fixtures.gateway import GatewayHarness, HarnessFactory
from tests.fixtures.open_responses import Conformance
from tests.fixtures.open_responses import parse_sse as parse
from tests.fixtures.tool_servers import script

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
    },
}


def _png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class Client:
    def __init__(self, gw: GatewayHarness, check: Conformance) -> None:
        self.gw, self.check = gw, check

    async def body(self, key: str = "tools", **fields: Any) -> dict[str, Any]:
        async with self.gw.client(self.gw.keys[key]) as http:
            resp = await http.post("/v1/responses", json=fields)
        assert resp.status_code == 200, resp.text
        body: dict[str, Any] = resp.json()
        self.check.response(body)
        return body

    async def events(self, key: str = "tools", **fields: Any) -> list[dict[str, Any]]:
        async with self.gw.client(self.gw.keys[key]) as http:
            resp = await http.post("/v1/responses", json={**fields, "stream": True})
        assert resp.status_code == 200, resp.text
        events = parse(resp.text)
        self.check.stream(events)
        return events


def _settled(response: dict[str, Any]) -> None:
    """What every finished Response states, whatever the case."""
    assert response["completed_at"] >= response["created_at"]
    assert response["truncation"] == "disabled" and response["background"] is False
    assert response["store"] is False and response["previous_response_id"] is None
    assert response["usage"]["input_tokens_details"]["cached_tokens"] >= 0


async def test_every_body_and_event_conforms(tool_gateway: GatewayHarness) -> None:
    check = Conformance()
    client = Client(tool_gateway, check)

    # basic, system prompt, multi-turn (the tester's item shapes), metadata and settings echoed
    plain = await client.body(
        key="user",
        model="scripted-chat",
        input=[{"type": "message", "role": "user", "content": "Say hello"}],
        temperature=0.3,
        top_p=0.9,
        metadata={"k": "v"},
    )
    assert plain["status"] == "completed" and plain["output_text"] == "Say hello"
    assert (plain["temperature"], plain["top_p"]) == (0.3, 0.9)
    assert plain["metadata"] == {"k": "v"} and plain["tools"] == []
    assert plain["tool_choice"] == "none" and plain["reasoning"] is None
    assert plain["max_output_tokens"] == 32  # the model's cap, applied by the head
    assert plain["max_tool_calls"] is None and "output_tokens_details" not in plain["usage"]
    _settled(plain)
    turns = await client.body(
        key="user",
        model="scripted-chat",
        instructions="Be terse.",
        input=[
            {"type": "message", "role": "system", "content": "You are a pirate."},
            {"type": "message", "role": "user", "content": "My name is Alice."},
            {"type": "message", "role": "assistant", "content": "Hello Alice!"},
            {"type": "message", "role": "developer", "content": "Stay short."},
            {"type": "message", "role": "user", "content": "What is my name?"},
        ],
    )
    assert turns["instructions"] == "Be terse." and turns["output_text"] == "What is my name?"
    assert (turns["temperature"], turns["top_p"]) == (1.0, 1.0)  # the engine's sampler defaults

    # image input on a vision model
    image = await client.body(
        key="user",
        model="scripted-vision",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": _png()},
                ],
            }
        ],
    )
    assert image["status"] == "completed"

    # streamed text: created, in_progress, ..., completed, each a full ResponseResource
    events = await client.events(key="user", model="scripted-chat", input="Count to five")
    assert events[0]["response"]["completed_at"] is None
    assert events[0]["response"]["status"] == events[1]["response"]["status"] == "in_progress"
    assert events[-1]["type"] == "response.completed"
    _settled(events[-1]["response"])

    # truncated: the message item is incomplete, like the response
    for cut in (
        await client.body(key="user", model="scripted-chat", input="a b c d", max_output_tokens=2),
        (
            await client.events(
                key="user", model="scripted-chat", input="a b c d", max_output_tokens=2
            )
        )[-1]["response"],
    ):
        assert cut["status"] == "incomplete" and cut["max_output_tokens"] == 2
        assert cut["incomplete_details"] == {"reason": "max_output_tokens"}
        assert [(i["type"], i["status"]) for i in cut["output"]] == [("message", "incomplete")]
        _settled(cut)

    # a client function call, whole, then streamed in fragments
    call_turn = {"call": "get_weather", "arguments": {"location": "San Francisco, CA"}}
    called = await client.body(
        model="scripted-tools", input=script(call_turn), tools=[WEATHER], tool_choice="required"
    )
    (item,) = called["output"]
    assert item["type"] == "function_call" and item["status"] == "completed"
    assert json.loads(item["arguments"]) == {"location": "San Francisco, CA"}
    assert called["tools"] == [{**WEATHER, "strict": None}]
    assert called["tool_choice"] == "required" and called["parallel_tool_calls"] is True

    events = await client.events(
        model="scripted-tools",
        input=script({**call_turn, "chunks": 3}),
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * 3,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, done = events[2]["item"], events[-2]["item"]
    assert added["arguments"] == "" and added["status"] == "in_progress"
    deltas = "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta"))
    assert deltas == events[-3]["arguments"] == done["arguments"]
    assert json.loads(deltas) == {"location": "San Francisco, CA"}
    assert done["call_id"] == added["call_id"] and done["name"] == "get_weather"
    final = events[-1]["response"]
    assert final["tool_choice"] == {"type": "function", "name": "get_weather"}
    # fragments straight from the head (nothing held: no tool declared), merged by index
    events = await client.events(key="user", model="scripted-chat", input="#tool f #chunks 3")
    deltas = [e["delta"] for e in events if e["type"].endswith("arguments.delta")]
    assert len(deltas) == 3 and json.loads("".join(deltas)) == {"q": "x"}
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["function_call"]

    # a server-tool run, then the answer with citations
    tools: list[dict[str, Any]] = [{"type": "web_search", "max_uses": 2}]
    run = script({"call": "web_search", "arguments": {"query": "q"}}, {"reply": "Done [1]."})
    served = await client.body(model="scripted-tools", input=run, tools=tools)
    assert [i["type"] for i in served["output"]] == ["web_search_call", "message"]
    assert served["tools"] == [
        {"type": "web_search", "max_uses": 2, "search_context_size": "medium"}
    ]
    assert served["max_tool_calls"] == 2
    events = await client.events(model="scripted-tools", input=run, tools=tools)
    assert "response.web_search_call.completed" in [e["type"] for e in events]

    # a reasoning model: reasoning item, reasoning split in usage; streamed, the reasoning
    # content part opens and closes around the reasoning_text events, before the answer
    reasoned = await client.events(
        key="user", model="scripted-reasoner", input="fine thanks", reasoning={"effort": "low"}
    )
    final = reasoned[-1]["response"]
    assert final["reasoning"] == {"effort": "low", "summary": None}
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    kinds = [e["type"] for e in reasoned]
    assert kinds[2:9] == [
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * 3,
        "response.reasoning_text.done",
        "response.content_part.done",
    ]
    thought = "".join(e["delta"] for e in reasoned[4:7])
    assert reasoned[7]["text"] == thought == final["output"][0]["content"][0]["text"]
    body = await client.body(key="user", model="scripted-reasoner", input="fine thanks")
    assert body["output"][0]["content"] == [{"type": "reasoning_text", "text": thought}]
    assert body["reasoning"] == {"effort": None, "summary": None}

    # the model breaks after the response started and before any answer: failed
    broken = script({"call": "web_search", "arguments": {"query": "q"}}, {"fail_before": True})
    failed = await client.body(model="scripted-tools", input=broken, tools=tools)
    assert failed["status"] == "failed" and failed["error"]["code"] == "upstream_error"
    events = await client.events(model="scripted-tools", input=broken, tools=tools)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["completed_at"] is not None

    # nothing outside the core schema but the documented extensions and deviation
    assert check.extensions == {
        "deviation:usage.output_tokens_details",
        "tool:web_search",
        "item:web_search_call",
        "event:response.web_search_call.in_progress",
        "event:response.web_search_call.completed",
        "deviation:event:response.reasoning_text.delta",
        "deviation:event:response.reasoning_text.done",
    }


async def test_omitted_sampling_states_the_engine_defaults(make_gateway: HarnessFactory) -> None:
    """The head reports the model's generation_config values; the Response states them."""
    tuned = {
        "id": "tuned",
        "head": "chat",
        "context_length": 64,
        "max_output_tokens": 32,
        "engine": {
            "backend": "scripted",
            "config": {"sampling_defaults": {"temperature": 0.7, "top_p": 0.8}},
        },
    }
    gw = await make_gateway({"catalog": [tuned]})
    client = Client(gw, Conformance())
    body = await client.body(key="user", model="tuned", input="hi")
    assert (body["temperature"], body["top_p"]) == (0.7, 0.8)
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.0, 0.0)
    body = await client.body(key="user", model="tuned", input="hi", temperature=0.2)
    assert (body["temperature"], body["top_p"]) == (0.2, 0.8)
