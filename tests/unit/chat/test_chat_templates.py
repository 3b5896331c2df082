"""The catalog's chat template for the Qwen tool model, rendered as vLLM renders it.

``deployments/chat/chat_templates/qwen2.5-coder-tools.jinja`` is Qwen2.5's own
template plus three sentences that make Qwen2.5-Coder-1.5B answer from a tool result
instead of repeating its call (docs/models.md, "Tool model"). These tests pin what the
model reads: the official structure around the additions (the call as a JSON object
inside ``<tool_call>``, results as ``<tool_response>`` in a user turn), the sentences
where they belong and nowhere else, and the config path that names the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from deployments.chat.vllm_config import REPO_ROOT, VLLMEngineConfig, template_path

CATALOG = REPO_ROOT / "configs/catalog/local.yaml"
TOOL_MODEL = "qwen2.5-coder-1.5b-instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ANSWER_ASK = "Use this result to answer the question above"
RESULT_RULE = "A <tool_response> holds the result of a call already made"


def _catalog_template() -> str:
    models = yaml.safe_load(CATALOG.read_text())["models"]
    (entry,) = (m for m in models if m["id"] == TOOL_MODEL)
    config = VLLMEngineConfig.model_validate(entry["engine"]["config"])
    assert config.chat_template is not None
    return template_path(config.chat_template).read_text()


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = (WEATHER,)) -> str:
    # vLLM hands templates the call's arguments as a dict (_postprocess_messages).
    for message in messages:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return str(
        tokenizer.apply_chat_template(
            messages,
            tools=list(tools) if tools else None,
            chat_template=_catalog_template(),
            tokenize=False,
            add_generation_prompt=True,
        )
    )


def _round_trip(results: list[str]) -> list[dict[str, Any]]:
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
        }
        for i, city in enumerate(["Paris", "Rome"][: len(results)])
    ]
    return [
        {"role": "user", "content": "What is the weather in Paris right now?"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        *(
            {"role": "tool", "tool_call_id": f"call_{i}", "content": result}
            for i, result in enumerate(results)
        ),
    ]


def test_a_tool_result_is_rendered_as_qwen_expects_and_asked_to_be_answered(
    qwen_tokenizer: Any,
) -> None:
    prompt = _render(qwen_tokenizer, _round_trip(['{"temperature_c": 21}']))
    assert prompt.endswith(
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temperature_c": 21}\n</tool_response>\n'
        f"{ANSWER_ASK}; call another function only if you still need more information."
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    system = prompt.split("<|im_end|>")[0]
    assert system.count(RESULT_RULE) == 1
    assert "{{" not in prompt  # the 1.5B GGUF's own template doubles the braces


def test_consecutive_results_share_one_user_turn_and_one_request_to_answer(
    qwen_tokenizer: Any,
) -> None:
    prompt = _render(
        qwen_tokenizer, _round_trip(['{"temperature_c": 21}', '{"temperature_c": 25}'])
    )
    last_user = prompt.rsplit("<|im_start|>user\n", 1)[1]
    assert last_user.count("<tool_response>") == 2
    assert prompt.count(ANSWER_ASK) == 1
    assert last_user.index(ANSWER_ASK) > last_user.rindex("</tool_response>")


def test_without_tools_or_results_the_template_is_qwens_own(qwen_tokenizer: Any) -> None:
    ask = [{"role": "user", "content": "Hi"}]
    official = qwen_tokenizer.apply_chat_template(ask, tokenize=False, add_generation_prompt=True)
    assert _render(qwen_tokenizer, [dict(m) for m in ask], tools=None) == official
    with_tools = _render(qwen_tokenizer, [dict(m) for m in ask])
    assert RESULT_RULE in with_tools and ANSWER_ASK not in with_tools


def test_template_paths_are_relative_to_the_repository(tmp_path: Path) -> None:
    name = "deployments/chat/chat_templates/qwen2.5-coder-tools.jinja"
    assert template_path(name) == REPO_ROOT / name and template_path(name).is_file()
    assert template_path(str(tmp_path)) == tmp_path
    base = {"model": "m"}
    with pytest.raises(ValidationError, match="does not exist"):
        VLLMEngineConfig.model_validate({**base, "chat_template": "configs/missing.jinja"})
    # Inline Jinja and bare names (vLLM's bundled templates) are left to vLLM.
    for value in ("{{ messages }}", "template_chatml.jinja"):
        assert VLLMEngineConfig.model_validate({**base, "chat_template": value}).chat_template
