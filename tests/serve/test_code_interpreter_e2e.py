"""code_interpreter end to end: the real Qwen head calls it, the sandbox runs the model's code.

The server-tool loop on `make run`'s tool-calling model: the call is forced
(``tool_choice`` required or naming the tool, met by the first turn, docs/api.md), the
tool-runner deployment runs the program in bubblewrap, its output goes back to the
model, and the model answers (``max_uses: 1``: the second turn is offered no tool). At temperature 0
the 1.5B model writes ``print(17 * 23)`` and answers from its output, so the answer
must hold 391 (the 0.5B wrote another call as text instead). The facts are:

- responses: the ``code_interpreter_call`` item carries the model's program and, as
  ``outputs``, exactly what that program prints when run in the sandbox again;
- usage and the ledger count both engine passes: the prompt total exceeds a one-pass
  prompt by at least the question, the program and its output (what the second pass
  reads); the completion total holds the program and the answer; the code run is
  billed in whole seconds;
- chat streams: one ``running_code`` chunk (the program is not echoed), one ``done``,
  the empty ``delta.annotations`` chunk, then the answer and its usage; no server call
  ever reaches the client as ``tool_calls``.
"""

from __future__ import annotations

import os
import shutil
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from serve_app.billing.records import UsageRecord
from serve_app.billing.store import LedgerStore
from serve_app.storage.db import Database
from tests.serve.conftest import QWEN, ServeStack

pytestmark = [
    pytest.mark.serve,
    pytest.mark.heads(QWEN),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing"),
]

# One run, short: the last turn is then offered no server tool and must answer.
CODE_TOOL = {"type": "code_interpreter", "max_uses": 1, "timeout_s": 5}
ASK = "Use Python to compute 17 * 23 and print the result."
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def coder_key(serve_stack: ServeStack) -> str:
    """A key of its own user, the one allowed to run code (the session's key stays plain)."""
    key = serve_stack.store.create_key("e2e-coder", "e2e-org")
    serve_stack.store.update_user("e2e-coder", code_interpreter=True)
    return key


@cache
def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    folder = Path(os.environ["GATEWAY_MODELS_DIR"]) / QWEN  # set by the serve_stack fixture
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def tokens(text: str) -> int:
    return len(_tokenizer().encode(text, add_special_tokens=False))


def ledger_record(request_id: str) -> UsageRecord:
    """The request's usage record, once the gateway's spool has reached the database."""
    store = LedgerStore(Database(os.environ["GATEWAY_DATABASE_URL"]))
    deadline = time.monotonic() + 20
    while (record := store.get(request_id)) is None and time.monotonic() < deadline:
        time.sleep(0.25)
    assert record is not None, f"no usage record for {request_id}"
    return record


def rerun_in_sandbox(code: str) -> str:
    """What ``code`` prints in the tool-runner's sandbox (stdout, then stderr)."""
    from ray import serve

    handle = serve.get_deployment_handle("tool-runner", app_name="gateway")
    reply = handle.run.remote(code, 5.0).result(timeout_s=60)
    assert reply.run is not None, reply.unavailable
    return str(reply.run.stdout + reply.run.stderr)


def test_responses_code_interpreter_runs_the_models_code(
    serve_stack: ServeStack, coder_key: str
) -> None:
    client = serve_stack.openai(coder_key)

    def create(max_output_tokens: int) -> Any:
        return client.responses.create(
            model=QWEN,
            input=ASK,
            tools=[CODE_TOOL],  # type: ignore[list-item]
            tool_choice="required",
            max_output_tokens=max_output_tokens,
            temperature=0,
        )

    # The first turn's prompt: the same request cut after one token (with its output
    # tokens spent the call is not run, so the loop stops after one pass).
    first_pass = create(1).usage.input_tokens
    response = create(MAX_TOKENS)
    assert response.status in ("completed", "incomplete"), response.error
    items = [item.model_dump() for item in response.output]
    kinds = [item["type"] for item in items]
    assert kinds[0] == "code_interpreter_call" and kinds.count("code_interpreter_call") == 1
    assert kinds[-1] == "message", kinds  # the model answered after reading the output
    call = items[0]
    assert call["status"] == "completed"  # a run that raised is still a completed run
    assert call["action"]["type"] == "call"
    code = call["action"]["arguments"]["code"]
    assert code.strip()
    (output,) = call["outputs"]
    assert output["type"] == "logs"
    assert output["logs"] == rerun_in_sandbox(code)
    assert "391" in output["logs"] and "391" in response.output_text, response.output_text

    usage = response.usage
    assert usage is not None
    # Both passes' prompts: the second holds the question, the call's program and its output
    # (not the tool schemas: the last turn is offered none, so it is shorter than the first).
    assert usage.input_tokens >= first_pass + tokens(ASK) + tokens(code) + tokens(output["logs"])
    # Turn one wrote the program (inside the call's JSON), turn two the answer.
    assert usage.output_tokens >= tokens(code) + tokens(response.output_text)
    assert usage.output_tokens <= MAX_TOKENS
    record = ledger_record(response.id)
    assert (record.status, record.route) == ("ok", "responses")
    assert (record.prompt_tokens, record.completion_tokens) == (
        usage.input_tokens,
        usage.output_tokens,
    )
    assert record.code_seconds >= 1.0  # the run's wall time, rounded up to whole seconds


CHAT: dict[str, Any] = {
    "model": QWEN,
    "messages": [{"role": "user", "content": ASK}],
    "tools": [CODE_TOOL],
    "temperature": 0,
}


@pytest.fixture(scope="module")
def chat_first_pass(serve_stack: ServeStack, coder_key: str) -> int:
    """The first turn's prompt on chat, measured as in the responses test."""
    one_pass = serve_stack.openai(coder_key).chat.completions.create(
        **CHAT, tool_choice="required", max_tokens=1
    )
    assert one_pass.usage is not None and one_pass.choices[0].finish_reason == "length"
    return one_pass.usage.prompt_tokens


def test_streamed_chat_code_interpreter_round(
    serve_stack: ServeStack, coder_key: str, chat_first_pass: int
) -> None:
    stream = serve_stack.openai(coder_key).chat.completions.create(
        **CHAT,
        tool_choice="required",
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    activity: list[dict[str, Any]] = []
    annotations: list[list[Any]] = []
    text, finish, usage, ids = "", None, None, set()
    for chunk in stream:
        ids.add(chunk.id)
        extra = chunk.model_extra or {}
        if "web_search" in extra:
            assert chunk.choices == []
            activity.append(extra["web_search"])
        usage = chunk.usage or usage
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            if delta.get("annotations") is not None:
                annotations.append(delta["annotations"])
            assert not delta.get("tool_calls"), "a server call leaked to the client"
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    running, done = activity[0], activity[-1]
    assert [a["status"] for a in activity] == ["running_code", "done"]
    assert running["language"] == "python" and running["code_chars"] > 0
    assert set(running) == {"status", "language", "code_chars"}  # the program is not echoed
    assert done == {"status": "done", "searches": 0, "price_per_search": 0.0}
    assert annotations == [[]]  # no web tool: the final content chunk's list is empty
    assert finish in ("stop", "length")  # never tool_calls: the client has nothing to run
    assert "391" in text, text  # answered from the program's output
    assert len(ids) == 1
    assert usage is not None
    assert usage.prompt_tokens >= chat_first_pass + tokens(ASK) + 1  # both passes' prompts
    assert usage.completion_tokens >= tokens(text) + 1  # and turn one's call
    assert usage.completion_tokens <= MAX_TOKENS
    record = ledger_record(ids.pop())
    assert (record.status, record.route) == ("ok", "chat")
    assert (record.prompt_tokens, record.completion_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert record.code_seconds >= 1.0


def test_chat_code_interpreter_forced_by_name(
    serve_stack: ServeStack, coder_key: str, chat_first_pass: int
) -> None:
    """A named ``tool_choice`` may force a server tool on chat (docs/api.md: first turn only)."""
    named = {"type": "function", "function": {"name": "code_interpreter"}}
    result = serve_stack.openai(coder_key).chat.completions.create(
        **CHAT,
        tool_choice=named,
        max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
    )
    choice = result.choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    body = result.model_dump()
    assert "web_search" not in body  # only a search run adds the web_search object
    assert result.usage is not None
    assert result.usage.prompt_tokens >= chat_first_pass + tokens(ASK) + 1
    assert result.usage.completion_tokens >= tokens(choice.message.content or "") + 1
    record = ledger_record(result.id)
    assert record.prompt_tokens == result.usage.prompt_tokens
    assert record.code_seconds >= 1.0  # the forced call ran in the sandbox
