"""Hostile and mistyped request bodies get a 400 envelope, never a 5xx (docs/reference/common.md,
docs/reference/chat.md).

Pydantic's lax mode would turn ``"5"`` or ``true`` into a number and ``"yes"``
into ``stream: true``; the official API refuses those, and so does the gateway,
so a request never runs with a value the caller did not write.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fixtures.gateway import GatewayHarness


def _chat(model: str = "scripted-chat", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}


def _assert_400(resp: Any, param: str | None, code: str = "invalid_value") -> None:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert error["param"] == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_completion_tokens": "5"}, "max_completion_tokens"),
        ({"n": "2"}, "n"),
        ({"temperature": "0.5"}, "temperature"),
        ({"top_p": True}, "top_p"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
        ({"stream": "yes"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"seed": "7"}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"chat_template_kwargs": 5}, "chat_template_kwargs"),
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
    ],
)
async def test_mistyped_chat_fields_are_400(
    gateway: GatewayHarness, extra: dict[str, Any], param: str
) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(**extra))
    _assert_400(resp, param)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": "5"}, "max_tokens"),
        ({"n": True}, "n"),
        ({"stream": "true"}, "stream"),
        ({"temperature": "1"}, "temperature"),
        ({"seed": -(2**63) - 1}, "seed"),
    ],
)
async def test_mistyped_completion_fields_are_400(
    gateway: GatewayHarness, extra: dict[str, Any], param: str
) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(
            "/v1/completions", json={"model": "scripted-chat", "prompt": "hi", **extra}
        )
    _assert_400(resp, param)


async def test_json_integers_written_as_floats_still_count(gateway: GatewayHarness) -> None:
    """``2.0`` is the integer 2 in JSON; only strings and booleans are refused."""
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(max_tokens=2.0, seed=3))
    assert resp.status_code == 200


@pytest.mark.parametrize("model", ["scripted-chat", "scripted-harmony"])
@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"type": "function"}, "tools[0].function"),
        ({"type": "function", "function": 5}, "tools[0].function"),
        ({"type": "function", "function": None}, "tools[0].function"),
        ({"type": "function", "function": {"name": 5}}, "tools[0].function.name"),
        ({"type": "function", "function": {"name": ""}}, "tools[0].function.name"),
    ],
)
async def test_malformed_function_tools_are_400(
    gateway: GatewayHarness, model: str, tool: dict[str, Any], param: str
) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat(model, tools=[tool]))
    _assert_400(resp, param)


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (
            "/v1/chat/completions",
            '{"model": "scripted-chat", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            '{"model": "scripted-chat", "messages": [{"role": "user", "content": '
            '[{"type": "text", "text": "\\udfff"}]}]}',
            "messages[0].content[0].text",
        ),
        (
            "/v1/chat/completions",
            '{"model": "scripted-chat", "messages": [{"role": "user", "content": "hi"}], '
            '"top_k": {"\\ud800": 1}}',
            "top_k",
        ),
        ("/v1/completions", '{"model": "scripted-chat", "prompt": ["ok", "\\udc00"]}', "prompt[1]"),
    ],
)
async def test_lone_surrogates_are_400(
    gateway: GatewayHarness, route: str, body: str, param: str
) -> None:
    """JSON may escape half a UTF-16 pair; no engine can encode it, so it is refused."""
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(route, content=body, headers={"content-type": "application/json"})
    _assert_400(resp, param)


async def test_surrogate_pairs_are_text(gateway: GatewayHarness) -> None:
    body = '{"model": "scripted-chat", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"] == "\U0001f600"


async def test_body_that_is_not_utf8_is_invalid_json(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(
            "/v1/chat/completions",
            content=b'{"model": "scripted-chat", "messages": "\xff\xfe"}',
            headers={"content-type": "application/json"},
        )
    _assert_400(resp, None, code="invalid_json")


@pytest.mark.parametrize("depth", [5_000, 200_000])
async def test_absurdly_nested_body_is_invalid_json(gateway: GatewayHarness, depth: int) -> None:
    body = '{"model": "scripted-chat", "messages": [], "top_k": %s}' % ("[" * depth + "]" * depth)
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    _assert_400(resp, None, code="invalid_json")


async def test_json_body_without_content_type_is_read(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", content=json.dumps(_chat()).encode())
    assert resp.status_code == 200


async def test_ignored_param_names_cannot_break_the_header(gateway: GatewayHarness) -> None:
    """Field names are the client's text: non-Latin-1 or CR/LF must not reach a header raw."""
    hostile = {"ключ": 1, "a\r\nX-Evil: 1": 2, "b" * 5000: 3}
    for stream in (False, True):
        async with gateway.client(gateway.keys["user"]) as http:
            resp = await http.post("/v1/chat/completions", json=_chat(stream=stream, **hostile))
        assert resp.status_code == 200
        header = resp.headers["x-service-ignored-params"]
        assert header.isascii() and header.isprintable()
        assert "%D0%BA" in header  # percent-encoded, so still readable
        assert "x-evil" not in resp.headers
        assert len(header) <= 1024


@pytest.mark.parametrize("url", ["http://[::1/x.png", "http://example.com:99999/x.png"])
async def test_unparseable_image_urls_are_invalid_image(gateway: GatewayHarness, url: str) -> None:
    content = [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"model": "scripted-vision", "messages": [{"role": "user", "content": content}]}
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=body)
    _assert_400(resp, "messages[0].content[1].image_url", code="invalid_image")


async def test_bad_image_on_a_text_model_is_invalid_image(gateway: GatewayHarness) -> None:
    """A broken image is named as such whatever the model; a good one on a text model
    is refused as an unsupported input."""
    bad = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post(
            "/v1/chat/completions",
            json={"model": "scripted-chat", "messages": [{"role": "user", "content": bad}]},
        )
    _assert_400(resp, "messages[0].content[0].image_url", code="invalid_image")


_HOSTILE: list[Any] = [
    None,
    True,
    -1,
    1.5,
    10**30,
    1e308,
    "",
    "x",
    [],
    [None],
    {},
    {"a": {"b": [None]}},
    [{"type": "function", "function": []}],
]
_CHAT_FIELDS = [
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "reasoning_effort",
    "chat_template_kwargs",
    "top_k",
    "user",
]


@pytest.mark.parametrize("field", _CHAT_FIELDS)
async def test_no_hostile_value_gives_a_server_error(gateway: GatewayHarness, field: str) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        for model in ("scripted-chat", "scripted-harmony"):
            for value in _HOSTILE:
                for route, body in (
                    ("/v1/chat/completions", {**_chat(model), field: value}),
                    ("/v1/completions", {"model": model, "prompt": "hi", field: value}),
                ):
                    resp = await http.post(route, json=body)
                    assert resp.status_code < 500, (route, field, value, resp.text)
                    if resp.status_code >= 400:
                        assert set(resp.json()["error"]) == {"message", "type", "code", "param"}


async def test_malformed_function_next_to_a_server_tool_is_400(gateway: GatewayHarness) -> None:
    gateway.store.update_user("alice", web_search=True)
    tools = [{"type": "web_search"}, {"type": "function", "function": 5}]
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=_chat("scripted-tools", tools=tools))
    _assert_400(resp, "tools[1].function")
