"""Every request rule of docs/reference/responses.md#request, through the real app."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.gateway import GatewayHarness, HarnessFactory


def req(**fields: Any) -> dict[str, Any]:
    return {"model": "scripted-chat", "input": "hello there", **fields}


async def post(gw: GatewayHarness, body: dict[str, Any], key: str = "user") -> Any:
    async with gw.client(gw.keys[key]) as http:
        return await http.post("/v1/responses", json=body)


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        (req(n=2), 400, "unknown_parameter", "n"),
        (req(stream_options={"include_usage": True}), 400, "unknown_parameter", "stream_options"),
        (req(reasoning={"effort": "low", "mode": "x"}), 400, "unknown_parameter", "reasoning.mode"),
        # Open Responses request fields the route does not serve: refused, never dropped
        (req(max_tool_calls=3), 400, "unknown_parameter", "max_tool_calls"),
        (req(conversation="conv_1"), 400, "unknown_parameter", "conversation"),
        (req(truncation="sometimes"), 400, "invalid_value", "truncation"),
        (req(top_logprobs=21), 400, "invalid_value", "top_logprobs"),
        (req(background=True), 400, "unsupported_parameter", "background"),
        # include: only values with data behind them; the refusal names the value
        *[
            (
                req(include=["message.output_text.logprobs", value]),
                400,
                "unsupported_parameter",
                "include[1]",
            )
            for value in (
                "reasoning.encrypted_content",
                "file_search_call.results",
                "web_search_call.results",
                "message.input_image.image_url",
                "computer_call_output.output.image_url",
                "anything.else",
            )
        ],
        (req(text={"verbosity": "loud"}), 400, "invalid_value", "text.verbosity"),
        (req(text={"format": {"type": "yaml"}}), 400, "invalid_value", "text.format"),
        # the contract: only {format: {type: text}}; the rest is an operator's switch
        (
            req(text={"format": {"type": "json_schema", "name": "x", "schema": {}}}),
            400,
            "unsupported_parameter",
            "text.format",
        ),
        (
            req(text={"format": {"type": "json_object"}}),
            400,
            "unsupported_parameter",
            "text.format",
        ),
        (
            req(tool_choice={"type": "allowed_tools", "tools": [], "mode": "auto"}),
            400,
            "unsupported_parameter",
            "tool_choice",
        ),
        (req(store=True), 400, "unsupported_parameter", "store"),
        (req(previous_response_id="resp_1"), 400, "unsupported_parameter", "previous_response_id"),
        (req(tool_choice={"type": "web_search"}), 400, "unsupported_parameter", "tool_choice"),
        (req(tool_choice="web_search"), 400, "unsupported_parameter", "tool_choice"),
        (req(model="ded/my-endpoint"), 400, "model_not_supported_for_endpoint", "model"),
        (req(model="nope"), 404, "model_not_found", "model"),
        (req(model="tts-model"), 400, "model_not_supported_for_endpoint", "model"),
        (req(reasoning={"effort": "high"}), 400, "unsupported_parameter", "reasoning.effort"),
        (
            req(model="scripted-reasoner", reasoning={"effort": "extreme"}),
            400,
            "invalid_value",
            "reasoning.effort",
        ),
        (
            req(model="scripted-reasoner", reasoning={"effort": "low", "summary": "always"}),
            400,
            "invalid_value",
            "reasoning.summary",
        ),
        (req(input=[]), 400, "invalid_value", "input"),
        (req(max_output_tokens=33), 400, "invalid_value", "max_output_tokens"),
        (req(temperature=3), 400, "invalid_value", "temperature"),
        (req(tools=[{"type": "file_search"}]), 400, "invalid_value", "tools"),
        (
            req(input=[{"type": "message", "role": "tool", "content": "x"}]),
            400,
            None,
            "input[0].role",
        ),
        (req(input=[{"type": "item_reference", "id": "x"}]), 400, None, "input[0].type"),
        (
            req(input=[{"type": "function_call_output", "call_id": "c1", "output": "4"}]),
            400,
            None,
            "input[0].call_id",
        ),
        (
            req(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
            400,
            None,
            "input[0].content[0]",
        ),
        (
            req(
                input=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_image", "image_url": "data:image/png;base64,AA"}
                        ],
                    }
                ]
            ),
            400,
            "unsupported_parameter",
            "input[0].content[0]",
        ),
    ],
)
async def test_refusals(
    gateway: GatewayHarness, body: dict[str, Any], status: int, code: str | None, param: str
) -> None:
    resp = await post(gateway, body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (
            req(text={"format": {"type": "json_schema", "name": "x", "schema": "no"}}),
            "invalid_value",
            "text.format.schema",
        ),
        (  # a catalog entry saying structured_outputs: false
            req(model="scripted-reasoner", text={"format": {"type": "json_schema", "schema": {}}}),
            "unsupported_parameter",
            "text.format",
        ),
        (
            req(model="scripted-reasoner", text={"format": {"type": "json_object"}}),
            "unsupported_parameter",
            "text.format",
        ),
    ],
)
async def test_refusals_with_structured_text_formats_on(
    make_gateway: HarnessFactory, body: dict[str, Any], code: str, param: str
) -> None:
    """``responses.structured_text_formats: true`` still refuses what cannot be decoded."""
    gateway = await make_gateway({"responses": {"structured_text_formats": True}})
    resp = await post(gateway, body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == code and resp.json()["error"]["param"] == param


async def test_server_tool_needs_flag_and_native_tool_calling(gateway: GatewayHarness) -> None:
    resp = await post(gateway, req(model="scripted-harmony", tools=[{"type": "web_fetch"}]))
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "insufficient_permissions"
    gateway.store.update_user("alice", web_fetch=True)
    resp = await post(gateway, req(tools=[{"type": "web_fetch"}]))  # scripted-chat: no tools
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "tools"


async def test_accepted_fields_and_echoes(gateway: GatewayHarness) -> None:
    resp = await post(
        gateway,
        req(
            model="scripted-chat:spot",  # deprecated suffix: no effect
            metadata={"trace": "abc", "n": "1"},
            store=False,
            previous_response_id=None,
            text={"format": {"type": "text"}},
            parallel_tool_calls=True,
            seed=3,
            temperature=0.5,
            top_p=0.9,
            user="end-user-1",
            tool_choice="auto",
        ),
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["metadata"] == {"trace": "abc", "n": "1"}
    assert body["store"] is False and body["previous_response_id"] is None
    assert body["model"] == "scripted-chat"


async def test_developer_role_instructions_and_flattened_functions(
    gateway: GatewayHarness,
) -> None:
    gateway.store.update_user("alice", web_search=True)
    function = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    resp = await post(
        gateway,
        req(
            model="scripted-tools",
            instructions="Answer in French.",
            input=[
                {"type": "message", "role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            ],
            tools=[function, {"type": "web_search"}],
        ),
    )
    assert resp.status_code == 200, resp.text
    prompt, _ = gateway.engines["scripted-tools"].seen[-1]
    assert prompt is not None and prompt.messages is not None
    roles = [m["role"] for m in prompt.messages]
    assert roles == ["system", "system", "user"]
    assert prompt.messages[0]["content"].startswith("Answer in French.\n\nYou can call tools")
    assert prompt.messages[1]["content"] == "Be brief."
    assert prompt.tools is not None
    assert prompt.tools[0] == {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object"}},
    }
    assert prompt.tools[1]["function"]["name"] == "web_search"


async def test_reasoning_effort_switches_thinking(gateway: GatewayHarness) -> None:
    for effort, thinking in (("none", False), ("minimal", True), ("high", True)):
        resp = await post(gateway, req(model="scripted-reasoner", reasoning={"effort": effort}))
        assert resp.status_code == 200
        prompt, _ = gateway.engines["scripted-reasoner"].seen[-1]
        assert prompt is not None
        assert prompt.chat_template_kwargs == {"enable_thinking": thinking}


async def test_parallel_tool_calls_false_is_named_as_ignored(gateway: GatewayHarness) -> None:
    """Every call the model makes is returned, so false is not honoured: header, echo true."""
    resp = await post(gateway, req(parallel_tool_calls=False))
    assert resp.status_code == 200
    assert "parallel_tool_calls" in resp.headers["x-service-ignored-params"]
    assert resp.json()["parallel_tool_calls"] is True
    resp = await post(gateway, req(parallel_tool_calls=True))
    assert "x-service-ignored-params" not in resp.headers
