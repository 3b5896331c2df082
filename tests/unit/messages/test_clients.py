"""Third-party clients of ``/v1/messages``: LangChain's ``ChatAnthropic`` with ``base_url``.

LangChain builds its own anthropic client (no transport can be handed in), so the
harness app is served on a loopback port by uvicorn, in a thread with its own loop,
as ``tests/unit/ingress/test_openapi_fuzz.py`` does.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from tests.fixtures.gateway import GatewayHarness, add_keys, build_harness, start_heads

Served = tuple[str, str, GatewayHarness]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """(base URL, API key, harness) of the harness app on uvicorn."""
    folder: Path = tmp_path_factory.mktemp("clients")
    harness = build_harness(folder / "gw.db")
    add_keys(harness)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(harness.app, host="127.0.0.1", port=port, log_level="warning")
    )

    async def serve() -> None:
        await start_heads(harness)
        try:
            await server.serve()
        finally:
            await harness.aclose()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code < 500:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield base, harness.keys["user"], harness
    server.should_exit = True
    thread.join(timeout=30)


def _chat(served: Served, model: str) -> ChatAnthropic:
    base, key, _ = served
    return ChatAnthropic(  # type: ignore[call-arg]
        model=model, base_url=base, api_key=key, max_tokens=16, max_retries=0
    )


def test_langchain_invoke_and_stream(served: Served) -> None:
    llm = _chat(served, "scripted-chat")
    answer = llm.invoke([HumanMessage("good morning")])
    assert answer.content == "good morning"
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] == 2
    pieces = [chunk.content for chunk in llm.stream([HumanMessage("one two three")])]
    text = "".join(
        p if isinstance(p, str) else "".join(b.get("text", "") for b in p) for p in pieces
    )
    assert text == "one two three"


def test_langchain_tool_round_trip(served: Served) -> None:
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return "sunny"

    llm = _chat(served, "scripted-tools").bind_tools([get_weather])
    asked = HumanMessage("weather in Paris? #tool get_weather")
    first = llm.invoke([asked])
    assert isinstance(first, AIMessage)
    (call,) = first.tool_calls
    assert call["name"] == "get_weather"
    llm.invoke([asked, first, ToolMessage("sunny", tool_call_id=call["id"])])
    prompt = served[2].engines["scripted-tools"].seen[-1][0]
    assert prompt is not None and prompt.messages is not None
    assert prompt.messages[1]["tool_calls"][0]["id"] == call["id"]
    assert prompt.messages[2] == {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}
