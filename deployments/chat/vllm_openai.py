"""vLLM's own OpenAI serving layer inside a chat head, and its output as head events.

Chat templates (with tools and ``chat_template_kwargs``), tool-call and
reasoning parsers, grammar-backed structured outputs (``response_format``,
``tool_choice`` required/named), multimodal inputs and logprobs are vLLM's
``OpenAIServingChat`` / ``OpenAIServingCompletion`` running over the head's
``AsyncLLM``: nothing of that is written again here. What this module adds is
the seam the gateway's contract needs:

* Rendering is split from generating. The head renders first (to count the
  prompt's tokens, check the context window and size ``max_tokens``, and let the
  gateway admit the request against its limits); ``create_*`` then reuses that
  rendering instead of tokenizing the prompt a second time (``_Prerendered``).
* vLLM's answer (SSE lines, or one response object) is turned into the plain
  ``TextDelta`` / ``GenerationDone`` dataclasses that cross the Ray hop, with the
  engine's exact per-choice token counts (``continuous_usage_stats``), so an
  aborted stream is billed for what was really generated.

Everything vLLM is imported lazily by the caller (``vllm_engine``) after the
engine is up; this module only touches vLLM names inside functions.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from deployments.chat.base import EngineEvent
from serve_app.contract.chat import (
    GenerationDone,
    PromptSpec,
    SamplingSpec,
    TextDelta,
    ToolCallDelta,
)
from serve_app.contract.errors import (
    GatewayError,
    InvalidRequestError,
    ModelUnavailableError,
    UpstreamError,
)

DENIED_EXTRAS = frozenset(
    {
        # The gateway owns these: routing, streaming shape, ids, batching.
        "model",
        "messages",
        "prompt",
        "stream",
        "stream_options",
        "stream_interval",
        "request_id",
        "priority",
        "session_id",
        "max_tokens",
        "max_completion_tokens",
        # Not safe from a client: templates, raw tensors, processor and transfer knobs.
        "chat_template",
        "prompt_embeds",
        "mm_payload",
        "mm_processor_kwargs",
        "media_io_kwargs",
        "kv_transfer_params",
        "ec_transfer_params",
        "vllm_xargs",
        "routed_experts_prompt_start",
        # Output the gateway's response shape has no place for (would be dropped).
        "return_mm_kwargs",
        "return_prompt_text",
        "return_token_ids",
        "return_token_offsets",
        "return_tokens_as_token_ids",
        "prompt_logprobs",
        # Beam search bypasses n-way sampling the limits reserve for.
        "use_beam_search",
        "length_penalty",
    }
)
"""Request fields vLLM knows that a client may not set through the gateway."""

_FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


@dataclass
class Rendered:
    """A vLLM request already rendered by its serving layer (kept in the head process)."""

    request: Any
    """vLLM's ``ChatCompletionRequest`` or ``CompletionRequest``."""
    rendering: Any
    """What ``render_*_request`` returned: (conversation, inputs) for chat, inputs otherwise."""
    prompt: PromptSpec
    sampling: SamplingSpec
    """What ``request`` was validated from (``max_tokens`` aside)."""


def relayable_extras(known_fields: frozenset[str]) -> frozenset[str]:
    """Extra request fields this head honours: vLLM's request fields minus ours."""
    return known_fields - DENIED_EXTRAS


def request_body(prompt: PromptSpec, sampling: SamplingSpec, model: str) -> dict[str, Any]:
    """The OpenAI-shaped body vLLM's serving layer validates.

    ``max_tokens`` is left out: the head sizes it after rendering and sets it on
    the validated request before generation.
    """
    body: dict[str, Any] = {"model": model, "n": sampling.n}
    for name in ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty"):
        if (value := getattr(sampling, name)) is not None:
            body[name] = value
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    body.update(sampling.extra)
    if prompt.kind == "chat":
        body["messages"] = prompt.messages or []
        if prompt.tools:
            body["tools"] = prompt.tools
            if prompt.tool_choice is not None:
                body["tool_choice"] = prompt.tool_choice
        if prompt.chat_template_kwargs:
            body["chat_template_kwargs"] = dict(prompt.chat_template_kwargs)
    else:
        body["prompt"] = prompt.token_ids if prompt.token_ids is not None else prompt.prompt
    return body


def error_from_response(error: Any) -> GatewayError:
    """vLLM's ``ErrorResponse`` (or its JSON) -> the gateway's error vocabulary."""
    info = error.get("error", error) if isinstance(error, dict) else error.error
    get = info.get if isinstance(info, dict) else lambda k, d=None: getattr(info, k, d)
    message = str(get("message", "") or "The model refused the request.")
    status = int(get("code", 400) or 400)
    param = get("param")
    if status == 400 or status == 422:
        too_long = "maximum context length" in message or "maximum model length" in message
        return InvalidRequestError(
            message,
            code="context_length_exceeded" if too_long else None,
            param=param if isinstance(param, str) else None,
        )
    if status == 503:
        return ModelUnavailableError(message)
    if status == 404:
        return UpstreamError(f"The model engine refused the request: {message}")
    return UpstreamError(f"The model engine failed: {message}")


def map_finish_reason(reason: str | None) -> str | None:
    """vLLM finish reasons -> OpenAI's; an abort or engine error ends with an error."""
    if reason is None:
        return None
    if reason == "abort":
        raise ModelUnavailableError("The request was aborted by the model engine.")
    if reason == "error":
        raise UpstreamError("The model engine failed while generating.")
    return _FINISH_REASONS.get(reason, "stop")


def _tool_calls(raw: list[dict[str, Any]] | None) -> list[ToolCallDelta]:
    calls: list[ToolCallDelta] = []
    for position, call in enumerate(raw or []):
        function = call.get("function") or {}
        calls.append(
            ToolCallDelta(
                id=call.get("id") or "",
                name=function.get("name") or "",
                arguments=function.get("arguments") or "",
                index=int(call.get("index", position)),
            )
        )
    return calls


def _reasoning_tokens(usage: dict[str, Any]) -> int | None:
    details = usage.get("completion_tokens_details") or {}
    value = details.get("reasoning_tokens")
    return int(value) if value is not None else None


def _done(usage: dict[str, Any], separate_channel: bool) -> GenerationDone:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return GenerationDone(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cached_tokens=int(cached) if cached is not None else None,
        reasoning_tokens=_reasoning_tokens(usage) if separate_channel else None,
    )


class StreamTranslator:
    """vLLM's SSE chunks (chat or completion) -> ``TextDelta``s then one ``GenerationDone``.

    With ``continuous_usage_stats`` every chunk carries its choice's cumulative
    completion tokens; they are copied onto the delta, which is what bills a
    stream that ends early.
    """

    def __init__(self, chat: bool, separate_channel: bool) -> None:
        self.chat = chat
        self.separate_channel = separate_channel
        self.done: GenerationDone | None = None

    def feed(self, line: str) -> list[EngineEvent]:
        if not line.startswith("data: "):
            return []
        payload = line[6:].strip()
        if payload == "[DONE]":
            return []
        data = json.loads(payload)
        if "error" in data and "choices" not in data:
            raise error_from_response(data)
        usage = data.get("usage") or {}
        choices = data.get("choices") or []
        if not choices:
            if usage:
                self.done = _done(usage, self.separate_channel)
            return []
        events: list[EngineEvent] = []
        for choice in choices:
            delta = self._delta(choice, usage)
            if delta is not None:
                events.append(delta)
        return events

    def _delta(self, choice: dict[str, Any], usage: dict[str, Any]) -> TextDelta | None:
        finish = map_finish_reason(choice.get("finish_reason"))
        logprobs = choice.get("logprobs")
        if self.chat:
            message = choice.get("delta") or {}
            text = message.get("content") or ""
            reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
            calls = _tool_calls(message.get("tool_calls"))
        else:
            text, reasoning, calls = choice.get("text") or "", "", []
        if not (text or reasoning or calls or finish or logprobs):
            return None
        return TextDelta(
            choice_index=int(choice.get("index", 0)),
            text=text,
            reasoning=reasoning if self.separate_channel else "",
            tool_calls=calls,
            finish_reason=finish,
            completion_tokens=int(usage.get("completion_tokens") or 0),
            logprobs=logprobs,
        )


def whole_response_events(response: Any, chat: bool, separate_channel: bool) -> list[EngineEvent]:
    """A non-streamed vLLM response -> one whole ``TextDelta`` per choice + ``GenerationDone``."""
    data = response.model_dump(exclude_none=True) if hasattr(response, "model_dump") else response
    usage = data.get("usage") or {}
    events: list[EngineEvent] = []
    for choice in data.get("choices") or []:
        if chat:
            message = choice.get("message") or {}
            text = message.get("content") or ""
            reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
            calls = _tool_calls(message.get("tool_calls"))
        else:
            text, reasoning, calls = choice.get("text") or "", "", []
        events.append(
            TextDelta(
                choice_index=int(choice.get("index", 0)),
                text=text,
                reasoning=reasoning if separate_channel else "",
                tool_calls=calls,
                finish_reason=map_finish_reason(choice.get("finish_reason")) or "stop",
                logprobs=choice.get("logprobs"),
            )
        )
    events.append(_done(usage, separate_channel))
    return events


async def stream_events(
    lines: AsyncIterator[str], chat: bool, separate_channel: bool, prompt_tokens: int
) -> AsyncIterator[EngineEvent]:
    """Translate a vLLM SSE generator; always ends with one ``GenerationDone``."""
    translator = StreamTranslator(chat, separate_channel)
    produced: dict[int, int] = {}
    async for line in lines:
        for event in translator.feed(line):
            if isinstance(event, TextDelta):
                produced[event.choice_index] = event.completion_tokens
            yield event
    yield translator.done or GenerationDone(
        prompt_tokens=prompt_tokens, completion_tokens=sum(produced.values())
    )


def subclass_prerendered(base: type) -> type:
    """``base`` (a vLLM serving class) whose ``render_*_request`` returns the head's rendering.

    The head calls ``render_*_request`` itself first; ``create_*`` would render
    again, so the subclass hands back the stored result for that request object
    (and renders normally for any request it has not seen).
    """

    class _Prerendered(base):
        _rendered: dict[int, Any]

        def remember(self, request: Any, rendering: Any) -> None:
            self.__dict__.setdefault("_rendered", {})[id(request)] = rendering

        def forget(self, request: Any) -> None:
            self.__dict__.setdefault("_rendered", {}).pop(id(request), None)

        async def render_chat_request(self, request: Any) -> Any:
            stored = self.__dict__.get("_rendered", {}).pop(id(request), None)
            if stored is not None:
                return stored
            return await super().render_chat_request(request)

        async def render_completion_request(self, request: Any) -> Any:
            stored = self.__dict__.get("_rendered", {}).pop(id(request), None)
            if stored is not None:
                return stored
            return await super().render_completion_request(request)

    _Prerendered.__name__ = f"Prerendered{base.__name__}"
    return _Prerendered
