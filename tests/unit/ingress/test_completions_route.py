"""Legacy completions (docs/reference/chat.md#completions) through the real app with scripted
heads."""

from __future__ import annotations

from tests.fixtures.gateway import GatewayHarness


async def test_sdk_completion_with_prompt_list(gateway: GatewayHarness) -> None:
    client = gateway.openai(gateway.keys["user"])
    result = await client.completions.create(
        model="scripted-chat", prompt=["a b", "c d e"], n=2, max_tokens=5
    )
    assert result.object == "text_completion"
    texts = {c.index: c.text for c in result.choices}
    assert texts == {0: "a b", 1: "a b", 2: "c d e", 3: "c d e"}
    assert result.usage is not None and result.usage.completion_tokens == 10


async def test_completion_stream(gateway: GatewayHarness) -> None:
    client = gateway.openai(gateway.keys["user"])
    stream = await client.completions.create(
        model="scripted-chat",
        prompt="x y z",
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    async for chunk in stream:
        usage = chunk.usage or usage
        text += "".join(c.text for c in chunk.choices)
    assert text == "x y z"
    assert usage is not None and usage.completion_tokens == 3


async def test_completion_guardrails(gateway: GatewayHarness) -> None:
    async with gateway.client(gateway.keys["user"]) as http:
        cap = await http.post(
            "/v1/completions", json={"model": "scripted-chat", "prompt": "a", "max_tokens": 99}
        )
        empty = await http.post("/v1/completions", json={"model": "scripted-chat", "prompt": []})
        window = await http.post(
            "/v1/completions",
            json={"model": "scripted-chat", "prompt": " ".join(["w"] * 60), "max_tokens": 10},
        )
    assert cap.status_code == 400 and cap.json()["error"]["param"] == "max_tokens"
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "prompt"
    assert window.status_code == 400
    assert window.json()["error"]["code"] == "context_length_exceeded"


async def test_an_empty_prompt_is_a_400_naming_prompt(gateway: GatewayHarness) -> None:
    """Not the engine's failure (it answered 502 ``upstream_error``): bad input."""
    async with gateway.client(gateway.keys["user"]) as http:
        for prompt in ("", ["a b", ""], [""]):
            resp = await http.post(
                "/v1/completions", json={"model": "scripted-chat", "prompt": prompt}
            )
            assert resp.status_code == 400, (prompt, resp.text)
            error = resp.json()["error"]
            assert error["param"] == "prompt" and error["type"] == "invalid_request_error"
            assert "empty" in error["message"]
