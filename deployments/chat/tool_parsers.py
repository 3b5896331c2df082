"""A vLLM tool parser for models that write hermes-style calls bare, fenced or tagged.

Qwen2.5-Coder-Instruct (the embedded default's tool-calling model is the 1.5B; the
recorded fixtures are the 0.5B's, which writes the same forms) decides well when to
call a tool, and its chat template asks for
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, but the model
mostly writes the JSON object bare, or inside a Markdown ```json fence, sometimes
several in a row; vLLM's ``hermes`` parser only looks inside the tags, and
``llama3_json`` refuses the tokenizer. Importing this module registers
``lenient_json`` with vLLM's ``ToolParserManager`` (the engine config's
``tool_parser_plugin``), which accepts all three forms:

* ``<tool_call>{...}</tool_call>`` anywhere, prose before it is content (as hermes);
* output that starts with a JSON object or list of objects (``name`` plus
  ``arguments``/``parameters``), one or several, separated by whitespace, commas
  or semicolons;
* the same inside ```json (or bare ```) fences.

A JSON object counts as a call only when its ``name`` is one of the request's
tools: a coder model answering "write a JSON example" or inventing a tool must
not turn prose into a call. Text after the calls is content; text that turns out
not to be a call is content, untouched.

Streaming follows OpenAI's shape: a first delta with id, type and name, then
argument fragments. While it is unclear whether the output is a call (it starts
with ``{``, ``[``, a fence or a partial ``<tool_call>``), text is held back and
released as content as soon as it is clear it is not. Held text that is still
undecided when generation stops is released by ``finish_streaming``, which
vLLM's ``DelegatingParser`` calls on parsers marked ``engine_based_streaming``
(the same contract vLLM's own ``K2HorizonToolParser`` uses); such parsers receive
deltas rather than the whole text, so the text is accumulated here.

Streamed arguments are the compact ``json.dumps`` of the arguments parsed so far
(vLLM's partial-JSON helpers, as its ``llama3_json`` parser does), so the
concatenated fragments equal the non-streaming ``arguments`` string exactly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import partial_json_parser
from partial_json_parser.core.options import Allow
from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.logger import init_logger
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tokenizers import TokenizerLike
from vllm.tool_parsers.abstract_tool_parser import Tool, ToolParser, ToolParserManager
from vllm.tool_parsers.utils import (
    find_common_prefix,
    find_tool_name,
    partial_json_loads,
    partial_tag_overlap,
)

logger = init_logger(__name__)

TOOL_PARSER_NAME = "lenient_json"
"""The ``tool_call_parser`` value that selects this parser."""

TAG_OPEN = "<tool_call>"
TAG_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"
_TAGS = {TAG_OPEN: TAG_CLOSE, RESPONSE_OPEN: RESPONSE_CLOSE}
"""Tags a call may come in. Qwen2.5-Coder-1.5B sometimes wraps a call in the tag of the
results (``<tool_response>{"function": "web_search", "arguments": {...}}``), 5 of 11
search prompts in bench/tool_decisions.py; the JSON inside must still name a declared
tool, so an imitated result (``<tool_response>{"temp": 21}``) stays content."""
_NAME_KEYS = ("name", "function")
FENCE = "```"
_FENCE_LANGUAGES = ("", "json")
_SEPARATORS = " \t\r\n,;"
_ARG_KEYS = ("arguments", "parameters")
_DECODER = json.JSONDecoder()

Verdict = Literal["pending", "prose", "tools"]


@dataclass
class _Call:
    """One call as far as it is known: name once complete, arguments parsed so far."""

    name: str
    arguments: Any = None
    complete: bool = False

    def arguments_json(self) -> str:
        args = {} if self.arguments is None else self.arguments
        return json.dumps(args, ensure_ascii=False)


@dataclass
class _Scan:
    """How a (possibly partial) output splits into content and calls.

    ``content`` is what may be shown as content now: everything for prose, the
    text before a ``<tool_call>`` tag and the text after the calls otherwise.
    """

    verdict: Verdict
    calls: list[_Call] = field(default_factory=list)
    content: str = ""


class _NotACall(Exception):
    """The JSON value at hand is not a tool call (so the text is prose from there)."""


def _is_prefix_of(text: str, marker: str) -> bool:
    """``text`` could still grow into ``marker`` (or already is it)."""
    return marker.startswith(text)


class _Scanner:
    """Splits model output into content and tool calls; used whole or on a prefix.

    ``final=False`` means more text may follow: undecided tails are ``pending``
    (held back) instead of being judged as they stand.
    """

    def __init__(self, tools: Sequence[Tool] | None) -> None:
        self.tools = list(tools or [])

    # -- one JSON value ------------------------------------------------------------------

    def _call_from(self, obj: Any, complete: bool) -> _Call | None:
        """A call for a parsed object, None while its name is not known yet.

        Raises ``_NotACall`` as soon as the object cannot be a call.
        """
        if not isinstance(obj, dict):
            raise _NotACall
        name = next((obj[k] for k in _NAME_KEYS if isinstance(obj.get(k), str)), None)
        if name is None:
            if complete or set(obj) - {"id", "type", *_ARG_KEYS}:
                raise _NotACall
            return None
        if not isinstance(name, str) or (self.tools and not find_tool_name(self.tools, name)):
            raise _NotACall
        arguments = next((obj[k] for k in _ARG_KEYS if k in obj), None)
        if isinstance(arguments, str) and complete:
            try:  # some models double-encode the arguments
                arguments = json.loads(arguments)
            except ValueError:
                raise _NotACall from None
        if complete and not isinstance(arguments, dict | None):
            raise _NotACall
        return _Call(name=name, arguments=arguments, complete=complete)

    def _calls_from(self, value: Any, complete: bool) -> list[_Call]:
        """Calls in one JSON value (an object or a list of objects)."""
        if isinstance(value, list):
            if complete and not value:
                raise _NotACall
            calls: list[_Call] = []
            for i, item in enumerate(value):
                last = i == len(value) - 1
                call = self._call_from(item, complete or not last)
                if call is None:
                    break
                calls.append(call)
            return calls
        call = self._call_from(value, complete)
        return [] if call is None else [call]

    def _partial_calls(self, text: str) -> list[_Call]:
        """Calls of an unfinished JSON value; names appear only once complete."""
        try:
            named, _ = partial_json_loads(text, Allow.ALL & ~Allow.STR)
            full, _ = partial_json_loads(text, Allow.ALL)
        except (partial_json_parser.core.exceptions.MalformedJSON, ValueError):
            raise _NotACall from None
        except (AssertionError, IndexError):
            # partial_json_parser's bracket matcher asserts on a mismatched closer
            # (``{"a": [1}``) and pops an empty stack on a surplus one (``{}}``): malformed
            # JSON, not a call. Uncaught, vLLM ends the stream with an error chunk.
            raise _NotACall from None
        calls = self._calls_from(named, complete=False)
        full_calls = self._calls_from(full, complete=False) if calls else []
        for call, fuller in zip(calls, full_calls, strict=False):
            if fuller.name == call.name:
                call.arguments = fuller.arguments
        return calls

    # -- whole output --------------------------------------------------------------------

    def scan(self, text: str, final: bool) -> _Scan:
        start = len(text) - len(text.lstrip())
        head = text[start:]
        if not head and not final:
            return _Scan("pending")  # leading whitespace: it may precede a call
        if head.startswith(("{", "[")) or (head and _is_prefix_of(head[:3], FENCE)):
            return self._scan_json(text, start, final)
        found = [(text.find(open_), open_) for open_ in _TAGS if open_ in text]
        if found:
            tag, open_ = min(found)
            return self._scan_tagged(text, tag, final, open_)
        # Prose, unless a <tool_call> tag is still arriving at the end.
        hold = 0 if final else max(partial_tag_overlap(text, open_) for open_ in _TAGS)
        return _Scan("prose", content=text[: len(text) - hold])

    def _scan_tagged(self, text: str, tag: int, final: bool, open_tag: str) -> _Scan:
        """hermes' form: prose, then ``<tool_call>{...}</tool_call>`` blocks, then content
        (or the same in ``<tool_response>`` tags, ``_TAGS``)."""
        close_tag = _TAGS[open_tag]
        scan = _Scan("tools", content=text[:tag])
        pos = tag
        while pos < len(text):
            rest = text[pos:]
            stripped = rest.lstrip()
            if not stripped:
                if not final:
                    return scan
                break
            if not stripped.startswith(open_tag):
                if not final and _is_prefix_of(stripped, open_tag):
                    return scan  # maybe the next tag
                scan.content += stripped
                break
            body_start = pos + (len(rest) - len(stripped)) + len(open_tag)
            close = text.find(close_tag, body_start)
            body = text[body_start:] if close == -1 else text[body_start:close]
            if close == -1 and not final:
                overlap = partial_tag_overlap(body, close_tag)
                body = body[: len(body) - overlap]
            calls = self._json_calls(body.strip(), final or close != -1)
            if calls is None:  # not JSON of a call: hermes keeps such output as content
                return _Scan("prose", content=text) if final or close != -1 else scan
            scan.calls.extend(calls)
            if close == -1:
                return scan
            pos = close + len(close_tag)
        if not scan.calls:
            return _Scan("prose", content=text)
        return scan

    def _json_calls(self, body: str, complete: bool) -> list[_Call] | None:
        """Calls in the body of one ``<tool_call>`` block; None if it is not a call."""
        if not body:
            return None if complete else []
        try:
            if complete:
                value, end = _DECODER.raw_decode(body)
                if body[end:].strip():
                    return None
                return self._calls_from(value, complete=True)
            return self._partial_calls(body)
        except (_NotACall, ValueError):
            return None

    def _scan_json(self, text: str, pos: int, final: bool) -> _Scan:
        """Bare or fenced JSON calls from ``pos``; what follows them is content."""
        scan = _Scan("tools")
        in_fence = False
        while True:
            item_start = pos
            while pos < len(text) and text[pos] in _SEPARATORS:
                pos += 1
            rest = text[pos:]
            if not rest:
                if not final:
                    return self._pending_if_empty(scan)
                break
            if rest.startswith(FENCE):
                if in_fence:  # closing fence
                    in_fence = False
                    pos += len(FENCE)
                    continue
                newline = rest.find("\n")
                if newline == -1:
                    if not final and _is_prefix_of(rest[len(FENCE) :].strip().lower(), "json"):
                        return self._pending_if_empty(scan)
                    return self._trailing(scan, text, item_start, final)
                if rest[len(FENCE) : newline].strip().lower() not in _FENCE_LANGUAGES:
                    return self._trailing(scan, text, item_start, final)
                in_fence = True
                pos += newline + 1
                continue
            if not final and _is_prefix_of(rest, FENCE):
                return self._pending_if_empty(scan)
            if rest[0] not in "{[":
                return self._trailing(scan, text, item_start, final)
            try:
                value, end = _DECODER.raw_decode(text, pos)
            except ValueError:
                if final:
                    return self._trailing(scan, text, item_start, final)
                try:
                    partial = self._partial_calls(_cut_fence(rest))
                except _NotACall:
                    return self._trailing(scan, text, item_start, final)
                if not partial:
                    return self._pending_if_empty(scan)
                scan.calls.extend(partial)
                return scan
            try:
                scan.calls.extend(self._calls_from(value, complete=True))
            except _NotACall:
                return self._trailing(scan, text, item_start, final)
            pos = end

        return scan if scan.calls else _Scan("prose", content=text)

    @staticmethod
    def _pending_if_empty(scan: _Scan) -> _Scan:
        return scan if scan.calls else _Scan("pending")

    @staticmethod
    def _trailing(scan: _Scan, text: str, start: int, final: bool) -> _Scan:
        """Text from ``start`` is not a call: all prose, or content after the calls."""
        if not scan.calls:
            return _Scan("prose", content=text)
        tail = text[start:].lstrip()  # the separator after the last call is not content
        if tail.strip() == FENCE:  # the closing fence of an unopened fence: markup, not prose
            return scan
        if not final:
            hold = max(partial_tag_overlap(tail, TAG_OPEN), partial_tag_overlap(tail, FENCE))
            tail = tail[: len(tail) - hold]
        scan.content = tail
        return scan


def _cut_fence(text: str) -> str:
    """An unfinished value inside a fence: drop a closing fence that is arriving."""
    for marker in ("\n" + FENCE, FENCE):
        cut = text.find(marker)
        if cut != -1:
            return text[:cut]
    overlap = partial_tag_overlap(text, FENCE)
    return text[: len(text) - overlap] if overlap else text


def _request_tools(request: Any) -> list[Tool]:
    return list(getattr(request, "tools", None) or [])


class LenientJsonToolParser(ToolParser):
    """hermes-style calls written bare, in ```json fences or in ``<tool_call>`` tags."""

    engine_based_streaming = True

    def __init__(self, tokenizer: TokenizerLike, tools: list[Tool] | None = None) -> None:
        super().__init__(tokenizer, tools)
        self._scanner = _Scanner(self.tools)
        self._text = ""
        self._sent_content = ""
        self._broken = False

    # -- complete output -----------------------------------------------------------------

    def extract_tool_calls(
        self, model_output: str, request: ChatCompletionRequest
    ) -> ExtractedToolCallInformation:
        if request.tool_choice == "none":
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        scanner = self._scanner if self._scanner.tools else _Scanner(_request_tools(request))
        scan = scanner.scan(model_output, final=True)
        if scan.verdict != "tools":
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        calls = [
            ToolCall(
                type="function",
                function=FunctionCall(name=call.name, arguments=call.arguments_json()),
            )
            for call in scan.calls
        ]
        return ExtractedToolCallInformation(
            tools_called=True, tool_calls=calls, content=scan.content or None
        )

    # -- streaming -----------------------------------------------------------------------

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        # Engine-based parsers get deltas (current_text == delta_text), legacy pairs get
        # the whole text; accumulating the deltas works for both.
        self._text += delta_text
        if request.tool_choice == "none":
            self._sent_content = self._text
            return DeltaMessage(content=delta_text) if delta_text else None
        if not self._scanner.tools:
            self._scanner = _Scanner(_request_tools(request))
        return self._delta_for(self._scanner.scan(self._text, final=False))

    def finish_streaming(self) -> DeltaMessage | None:
        """Release what was held back: the output ended, so undecided text is content.

        Arguments are not flushed here: a call is streamed whole by the time its JSON
        completes, and the remainder of one cut short is appended by vLLM's
        ``DelegatingParser.finalize_generation`` (``get_remaining_unstreamed_args``).
        """
        scan = self._scanner.scan(self._text, final=True)
        if scan.verdict != "tools" and self.prev_tool_call_arr:
            return None  # see _delta_for: the call that went out stays as it is
        content = self._new_content(scan.content)
        return DeltaMessage(content=content) if content else None

    def _delta_for(self, scan: _Scan) -> DeltaMessage | None:
        if scan.verdict != "tools" and self.prev_tool_call_arr:
            # A call already went out and its JSON turned malformed: a stream cannot take
            # it back, and its text is not content either; the rest is dropped (logged).
            if not self._broken:
                logger.warning("Tool-call JSON turned malformed after the call was streamed.")
                self._broken = True
            return None
        content = self._new_content(scan.content if scan.verdict != "pending" else "")
        tool_deltas: list[DeltaToolCall] = []
        if scan.verdict == "tools":
            for index, call in enumerate(scan.calls):
                tool_deltas.extend(self._call_deltas(index, call))
        if content or tool_deltas:
            return DeltaMessage(content=content, tool_calls=tool_deltas)
        return None

    def _new_content(self, content: str) -> str | None:
        if not content.startswith(self._sent_content):
            # The split moved (prose became "content before a tag"): send only growth.
            return None
        new = content[len(self._sent_content) :]
        self._sent_content = content
        return new or None

    def _call_deltas(self, index: int, call: _Call) -> list[DeltaToolCall]:
        deltas: list[DeltaToolCall] = []
        if index >= len(self.prev_tool_call_arr):
            if index > len(self.prev_tool_call_arr):
                return deltas  # an earlier call is not announced yet
            self.prev_tool_call_arr.append({"name": call.name, "arguments": None})
            self.streamed_args_for_tool.append("")
            self.current_tool_id = index
            deltas.append(
                DeltaToolCall(
                    index=index,
                    type="function",
                    id=make_tool_call_id(),
                    function=DeltaFunctionCall(name=call.name),
                )
            )
        sent = self.streamed_args_for_tool[index]
        if not call.complete and not isinstance(call.arguments, dict):
            return deltas  # not started, or double-encoded (a string until it is complete)
        current = call.arguments_json()
        previous = self.prev_tool_call_arr[index].get("arguments")
        self.prev_tool_call_arr[index]["arguments"] = call.arguments if call.arguments else {}
        if call.complete:
            stable = current
        else:
            # Partial JSON comes back auto-closed ('{"city": "Par"}'): send only what two
            # different successive parses agree on, as vLLM's llama3_json parser does.
            before = None if previous is None else json.dumps(previous, ensure_ascii=False)
            if before is None or before == current:
                return deltas
            stable = find_common_prefix(before, current)
        if len(stable) > len(sent) and stable.startswith(sent):
            self.streamed_args_for_tool[index] = stable
            deltas.append(
                DeltaToolCall(
                    index=index,
                    function=DeltaFunctionCall(arguments=stable[len(sent) :]),
                )
            )
        return deltas


ToolParserManager.register_module(TOOL_PARSER_NAME, module=LenientJsonToolParser)

__all__ = ["TOOL_PARSER_NAME", "LenientJsonToolParser"]
