"""End to end: Ray Serve on CPU, the real vLLM head on SmolLM2, the openai SDK."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.serve.conftest import LOOPBACK, SMOLLM, ServeStack

pytestmark = pytest.mark.serve


def test_chat_non_stream_answers(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    result = client.chat.completions.create(
        model=SMOLLM,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
    )
    text = result.choices[0].message.content or ""
    assert "Paris" in text
    assert result.usage is not None
    assert 0 < result.usage.completion_tokens <= 12
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens


def test_chat_stream_with_usage(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    stream = client.chat.completions.create(
        model=SMOLLM,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        usage = chunk.usage or usage
        pieces.extend(c.delta.content or "" for c in chunk.choices)
    assert "".join(pieces).strip()
    assert usage is not None and 0 < usage.completion_tokens <= 8


def test_n_two_choices(serve_stack: ServeStack) -> None:
    result = serve_stack.openai().chat.completions.create(
        model=SMOLLM,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=4,
        n=2,
        temperature=1.0,
        seed=7,
    )
    assert sorted(c.index for c in result.choices) == [0, 1]
    assert all(c.message.content for c in result.choices)
    assert result.usage is not None
    # Completion tokens are summed over choices: each choice made at least one.
    assert 2 <= result.usage.completion_tokens <= 8


def test_max_tokens_length_finish(serve_stack: ServeStack) -> None:
    result = serve_stack.openai().completions.create(
        model=SMOLLM, prompt="Once upon a time", max_tokens=3, temperature=0
    )
    assert result.choices[0].finish_reason == "length"
    assert result.usage is not None and result.usage.completion_tokens == 3


def test_errors_through_serve(serve_stack: ServeStack) -> None:
    client = serve_stack.openai()
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as context:
        client.chat.completions.create(
            model=SMOLLM,
            messages=[{"role": "user", "content": "word " * 1100}],
            max_tokens=10,
        )
    assert context.value.code == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        serve_stack.openai("gwk_" + "x" * 40).models.list()


def test_models_list_via_sdk(serve_stack: ServeStack) -> None:
    ids = {m.id for m in serve_stack.openai().models.list()}
    assert {SMOLLM, "scripted-e2e"} <= ids


def test_raw_sse_framing_and_headers(serve_stack: ServeStack) -> None:
    body = {
        "model": SMOLLM,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "stream": True,
        "logit_bias": {"28": 1},
        "no_such_engine_field": True,
    }
    with serve_stack.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-service-ignored-params"] == "no_such_engine_field"
        raw = "".join(r.iter_text())
    blocks = [b for b in raw.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks)
    assert blocks[-1] == "data: [DONE]"
    first = json.loads(blocks[0][len("data: ") :])
    assert first["object"] == "chat.completion.chunk"


def test_mid_stream_failure_through_ray(serve_stack: ServeStack) -> None:
    body = {
        "model": "scripted-e2e",
        "messages": [{"role": "user", "content": "a b c #fail-after 1"}],
        "stream": True,
    }
    with serve_stack.http() as http:
        resp = http.post("/v1/chat/completions", json=body)
        early = http.post(
            "/v1/chat/completions",
            json={**body, "messages": [{"role": "user", "content": "#fail-before"}]},
        )
    assert resp.status_code == 200
    events = [b[len("data: ") :] for b in resp.text.split("\n\n") if b]
    assert any('"upstream_error"' in e for e in events)
    assert events[-1] == "[DONE]"
    assert early.status_code == 502


def test_external_model_through_the_loopback_provider(serve_stack: ServeStack) -> None:
    """The shipped external stand-in: org switch, disclosure, and a real upstream answer."""
    key = serve_stack.store.create_key("ext-e2e-user", "ext-e2e-org")
    client = serve_stack.openai(key)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    with pytest.raises(openai.PermissionDeniedError) as denied:
        client.chat.completions.create(model=LOOPBACK, messages=question, max_tokens=4)
    assert denied.value.code == "external_provider_not_enabled"
    serve_stack.store.update_org("ext-e2e-org", external_providers=True)

    raw = client.chat.completions.with_raw_response.create(
        model=LOOPBACK, messages=question, max_tokens=12, temperature=0
    )
    assert raw.headers["x-service-residency"] == "external"
    result = raw.parse()
    assert "Paris" in (result.choices[0].message.content or "")
    assert result.model == LOOPBACK
    assert result.to_dict()["routing"]["region"] == "local"
    assert result.usage is not None and 0 < result.usage.completion_tokens <= 12

    stream = client.chat.completions.create(
        model=LOOPBACK,
        messages=question,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk.to_dict() for chunk in stream]
    text = "".join(c["delta"].get("content") or "" for x in chunks for c in x["choices"])
    assert text.strip()
    assert [x["routing"]["region"] for x in chunks if "routing" in x] == ["local"]
    assert any(x.get("usage") for x in chunks)


def test_chat_replica_log_file_has_our_lines_and_requests(serve_stack: ServeStack) -> None:
    """The chat head's Serve log file (the one the dashboard shows) keeps growing: vLLM's
    logging set-up no longer closes Serve's handlers in the replica."""
    import ray

    serve_stack.openai().chat.completions.create(
        model=SMOLLM, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    logs = list((session / "logs" / "serve").glob(f"replica_gateway_chat-{SMOLLM}_*.log"))
    assert logs, "no Serve log file for the SmolLM2 head"
    text = "\n".join(log.read_text(errors="replace") for log in logs)
    assert f"head {SMOLLM} ready" in text  # deployments.chat.head, at start
    assert "vLLM engine for" in text  # deployments.chat.vllm_engine
    assert "generate" in text  # Serve's access line for the gateway's call
