"""An Anthropic Messages request as the chat request it means (docs/reference/messages.md).

The Messages routes answer through the chat service (``TextService.chat``), so a
Messages call meets the same catalog, limits, quotas, ledger and heads as the
equivalent ``/v1/chat/completions`` call: this module only rewrites the request.
The mapping is vLLM's (``AnthropicServingMessages.to_chat_completion_request``,
held to it by ``tests/unit/messages/test_vllm_parity.py``), with the gateway's
rules on top: thinking only on models with a reasoning channel, server tools
refused, and every field that cannot be honoured named in ``ignored``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from serve_app.catalog.config import CatalogModel
from serve_app.protocol.errors import InvalidRequestError
from serve_app.protocol.messages import (
    ContentBlock,
    CountTokensRequest,
    MessageParam,
    MessagesRequest,
    SystemBlock,
    Tool,
    ToolChoice,
)

BILLING_HEADER_PREFIX = "x-anthropic-billing-header"
"""Claude Code's first system block: a per-request hash that would defeat prefix caching
(vLLM's layer drops it too)."""

STOP_IN_OUTPUT = "include_stop_str_in_output"
"""Relayed with ``stop_sequences`` so the answer can say which one matched; the service
strips it from the text again and never names it as ignored (the client did not send it)."""

MAX_STOP_SEQUENCES = 4
"""The chat route's limit on stop strings, which the Messages route shares."""


@dataclass
class ChatPlan:
    """The chat request a Messages request becomes, and what it could not carry."""

    body: dict[str, Any]
    ignored: list[str] = field(default_factory=list)
    stop_sequences: list[str] = field(default_factory=list)


def to_chat(request: MessagesRequest | CountTokensRequest, model: CatalogModel) -> ChatPlan:
    """The chat body (``ChatCompletionRequest``'s fields) for ``request`` on ``model``."""
    ignored = _extras(request)
    body: dict[str, Any] = {"model": request.model, "messages": chat_messages(request)}
    tools = chat_tools(request.tools)
    if tools:
        body["tools"] = tools
    if request.tool_choice is not None:
        _apply_tool_choice(body, request.tool_choice, bool(tools))
    body.update(_thinking(request, model, ignored))
    plan = ChatPlan(body, ignored)
    if isinstance(request, MessagesRequest):
        _sampling(request, model, plan)
    return plan


def _extras(request: MessagesRequest | CountTokensRequest) -> list[str]:
    """Fields outside the API as the gateway serves it, and accepted no-op markers."""
    names = sorted(request.model_extra or {})
    blocks = [b for m in request.messages if not isinstance(m.content, str) for b in m.content]
    if any(b.cache_control is not None for b in blocks) or any(
        b.cache_control is not None for b in (request.system or []) if not isinstance(b, str)
    ):
        names.append("cache_control")
    if request.tool_choice is not None and request.tool_choice.disable_parallel_tool_use:
        names.append("tool_choice.disable_parallel_tool_use")
    return names


def _sampling(request: MessagesRequest, model: CatalogModel, plan: ChatPlan) -> None:
    body = plan.body
    cap = model.max_output_tokens
    if cap is not None and request.max_tokens > cap:
        # Agent clients ask for more than small models give (Claude Code: 32000); the head
        # then sizes the answer to the window left, at most the model's cap, and says so.
        plan.ignored.append("max_tokens")
    else:
        body["max_tokens"] = request.max_tokens
    for name in ("temperature", "top_p", "top_k"):
        if (value := getattr(request, name)) is not None:
            body[name] = value
    if request.metadata is not None:
        if request.metadata.user_id is not None:
            body["user"] = request.metadata.user_id
        plan.ignored += [f"metadata.{key}" for key in sorted(request.metadata.model_extra or {})]
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    stops = [s for s in request.stop_sequences or [] if s]
    if stops:
        if len(stops) > MAX_STOP_SEQUENCES:
            raise InvalidRequestError(
                f"stop_sequences: at most {MAX_STOP_SEQUENCES} are allowed.",
                code="invalid_value",
                param="stop_sequences",
            )
        if model.reasoning.separate_channel:
            raise InvalidRequestError(
                "stop_sequences are not supported on models with a reasoning channel.",
                code="unsupported_parameter",
                param="stop_sequences",
            )
        body["stop"] = stops
        body[STOP_IN_OUTPUT] = True
        plan.stop_sequences = stops


def _thinking(
    request: MessagesRequest | CountTokensRequest, model: CatalogModel, ignored: list[str]
) -> dict[str, Any]:
    """``thinking`` as the chat route's ``reasoning_effort`` (docs/reference/messages.md#thinking).

    Anthropic's default is no thinking; a model whose deliberation can be switched
    off (``reasoning.controllable``) is switched off unless ``thinking`` asks for it.
    """
    thinking = request.thinking
    reasoning = model.reasoning
    wants = thinking is not None and thinking.type != "disabled"
    if wants and not reasoning.separate_channel:
        raise InvalidRequestError(
            f"thinking is not supported by model '{model.id}': it has no reasoning "
            "channel (its catalog entry's reasoning.separate_channel is false).",
            code="unsupported_parameter",
            param="thinking",
        )
    max_tokens = request.max_tokens if isinstance(request, MessagesRequest) else None
    budget = thinking.budget_tokens if thinking is not None else None
    if budget is not None and max_tokens is not None and budget >= max_tokens:
        raise InvalidRequestError(
            "thinking.budget_tokens must be less than max_tokens.",
            code="invalid_value",
            param="thinking.budget_tokens",
        )
    if thinking is not None and thinking.budget_tokens is not None:
        ignored.append("thinking.budget_tokens")  # the engine has no thinking budget
    if reasoning.controllable:
        return {"reasoning_effort": "medium" if wants else "none"}
    if thinking is not None and thinking.type == "disabled" and reasoning.separate_channel:
        ignored.append("thinking")  # this model always deliberates
    return {}


def chat_tools(tools: list[Tool] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(tools or []):
        if tool.type not in (None, "custom"):
            raise InvalidRequestError(
                f"Tool type '{tool.type}' is an Anthropic server tool, which this service "
                "does not run; declare client tools with name, description and input_schema.",
                code="unsupported_tool",
                param=f"tools[{index}].type",
            )
        if tool.input_schema is None:
            raise InvalidRequestError(
                f"Missing required parameter: 'tools[{index}].input_schema'.",
                code="missing_required_parameter",
                param=f"tools[{index}].input_schema",
            )
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        out.append({"type": "function", "function": function})
    return out


def _apply_tool_choice(body: dict[str, Any], choice: ToolChoice, has_tools: bool) -> None:
    if choice.type == "tool" and not choice.name:
        raise InvalidRequestError(
            "tool_choice.name is required when type is 'tool'.",
            code="missing_required_parameter",
            param="tool_choice.name",
        )
    if choice.type in ("any", "tool") and not has_tools:
        raise InvalidRequestError(
            f"tool_choice '{choice.type}' needs tools.", code="invalid_value", param="tool_choice"
        )
    if not has_tools:
        return
    if choice.type == "none":
        body["tool_choice"] = "none"
    elif choice.type == "auto":
        body["tool_choice"] = "auto"
    elif choice.type == "any":
        body["tool_choice"] = "required"
    else:
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}


def chat_messages(request: MessagesRequest | CountTokensRequest) -> list[dict[str, Any]]:
    """``system`` then each message, as chat messages (tool results as ``tool`` messages)."""
    out: list[dict[str, Any]] = []
    system = system_text(request.system)
    if system:
        out.append({"role": "system", "content": system})
    for index, message in enumerate(request.messages):
        out.extend(_message(message, index))
    return out


def system_text(system: str | list[SystemBlock] | None) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    kept = [b.text for b in system if b.text and not b.text.startswith(BILLING_HEADER_PREFIX)]
    return "\n\n".join(kept)


def _message(message: MessageParam, index: int) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "assistant":
        return [_assistant(message.content, index)]
    return _user(message.content, index)


def _assistant(blocks: list[ContentBlock], index: int) -> dict[str, Any]:
    """Text and ``tool_use`` blocks; earlier thinking is not sent back to the template."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for position, block in enumerate(blocks):
        where = f"messages[{index}].content[{position}]"
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "tool_use":
            if not block.id or not block.name:
                raise InvalidRequestError(
                    "A tool_use block needs id and name.", code="invalid_value", param=where
                )
            arguments = json.dumps(block.input or {}, ensure_ascii=False)
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": arguments},
                }
            )
        elif block.type in ("image", "tool_result"):
            raise InvalidRequestError(
                f"An assistant message cannot hold a {block.type} block.",
                code="invalid_value",
                param=where,
            )
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        out["tool_calls"] = calls
    return out


def _user(blocks: list[ContentBlock], index: int) -> list[dict[str, Any]]:
    """Tool results first (they answer the previous turn's calls), then the user's parts."""
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for position, block in enumerate(blocks):
        where = f"messages[{index}].content[{position}]"
        if block.type == "text":
            parts.append({"type": "text", "text": block.text or ""})
        elif block.type == "image":
            parts.append(image_part(block.source, where))
        elif block.type == "tool_result":
            results.extend(_tool_result(block, where))
        elif block.type == "tool_use":
            raise InvalidRequestError(
                "A user message cannot hold a tool_use block.", code="invalid_value", param=where
            )
    out = [r for r in results if r["role"] == "tool"]
    images = [p for r in results if r["role"] == "user" for p in r["content"]]
    if parts or images or not out:
        out.append({"role": "user", "content": images + parts})
    return out


def _tool_result(block: ContentBlock, where: str) -> list[dict[str, Any]]:
    """A ``tool`` message; images a result holds follow as a user message (chat's tool
    messages carry text only)."""
    if not block.tool_use_id:
        raise InvalidRequestError(
            "A tool_result block needs tool_use_id.", code="invalid_value", param=where
        )
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    content = block.content
    if isinstance(content, str):
        texts.append(content)
    for item in content if isinstance(content, list) else []:
        if item.get("type") == "text":
            texts.append(str(item.get("text", "")))
        elif item.get("type") == "image":
            images.append(image_part(item.get("source"), where))
    text = "\n".join(texts)
    if block.is_error:
        text = f"Error: {text}"
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}
    ]
    if images:
        out.append({"role": "user", "content": images})
    return out


def image_part(source: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """An image block as chat's ``image_url`` part: the chat route then sniffs, bounds and
    (for a URL) fetches it through the SSRF guard, as for any chat image."""
    kind = (source or {}).get("type")
    if kind == "base64" and isinstance((source or {}).get("data"), str):
        assert source is not None
        media = source.get("media_type") or "image/png"
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{source['data']}"}}
    if kind == "url" and isinstance((source or {}).get("url"), str) and source:
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise InvalidRequestError(
        "An image block's source must be {type: base64, media_type, data} or {type: url, url}.",
        code="invalid_value",
        param=f"{where}.source",
    )
