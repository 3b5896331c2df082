"""From a validated wire request to a ``HeadRequest`` (the rules of docs/reference/chat.md).

Rules that need only the catalog live here; rules that need the tokenizer
(context window) live in the head. Each function returns the names of the
parameters it had to drop so the route can publish ``x-service-ignored-params``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Protocol

from serve_app.catalog.catalog import honours_structured_outputs
from serve_app.catalog.config import CatalogModel
from serve_app.contract.chat import HeadRequest, PromptSpec, SamplingSpec
from serve_app.inference.chat.reasoning import translate_reasoning_effort
from serve_app.inference.ids import new_request_id
from serve_app.inference.images import ImageFetcher, ImagePolicy
from serve_app.protocol.chat import ChatCompletionRequest, ChatMessage
from serve_app.protocol.common import SamplingFields
from serve_app.protocol.completions import CompletionRequest
from serve_app.protocol.errors import InvalidRequestError

SERVER_TOOL_TYPES = frozenset({"web_search", "web_fetch", "code_interpreter"})
_MIN_TEMPERATURE_FOR_N = 1e-5


@dataclass
class Translated:
    head_request: HeadRequest
    ignored_params: list[str] = field(default_factory=list)


class CheckedText(Protocol):
    """A body that can name its first text that is not valid Unicode (chat, completions,
    the Messages API)."""

    def unencodable_field(self) -> str | None: ...


def reject_unencodable(body: CheckedText) -> None:
    """400 for text that is not valid Unicode (a lone UTF-16 surrogate escaped in JSON).

    Checked first, on every chat and completion request, because such text would
    otherwise reach a tokenizer (a 502 from the engine) or be echoed into a
    response that cannot be encoded (a 500).
    """
    path = body.unencodable_field()
    if path is not None:
        raise InvalidRequestError(
            "The request contains text that is not valid Unicode (an unpaired UTF-16 "
            "surrogate escape such as \\ud800)"
            + (f" in '{path}'." if path else " in a field name."),
            code="invalid_value",
            param=path or None,
        )


def _check_common(
    body: SamplingFields, model: CatalogModel, max_tokens: int | None, param: str
) -> None:
    cap = model.max_output_tokens
    if max_tokens is not None and cap is not None and max_tokens > cap:
        raise InvalidRequestError(
            f"{param} is too large: {max_tokens}. This model supports at most {cap} "
            "completion tokens.",
            code="invalid_value",
            param=param,
        )
    if body.n > 1 and body.temperature is not None and body.temperature < _MIN_TEMPERATURE_FOR_N:
        raise InvalidRequestError(
            "n > 1 needs temperature >= 1e-5 (greedy decoding would repeat one answer).",
            code="invalid_value",
            param="n",
        )
    if body.stop is not None and model.reasoning.separate_channel:
        raise InvalidRequestError(
            "stop is not supported on models with a separate reasoning channel.",
            code="unsupported_parameter",
            param="stop",
        )


def _sampling(body: SamplingFields, extra: dict[str, Any]) -> SamplingSpec:
    return SamplingSpec(
        max_tokens=0,  # sized by the head once the prompt is tokenized
        temperature=body.temperature,
        top_p=body.top_p,
        n=body.n,
        stop=body.stop_list(),
        seed=body.seed,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        extra=extra,
    )


def check_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Client function tools are relayed as given (the chat template renders them);
    server tools are left out: the tool loop (``serve_app.inference.chat.tool_loop``) validates and
    offers them; any other type is a 400 naming ``tools``.

    A function tool must at least carry ``function: {name: "..."}``: the chat
    template, the Harmony ``strict`` rule and the tool loop all read that name,
    and a malformed entry is the caller's mistake (400), not the engine's (502).
    """
    functions: list[dict[str, Any]] = []
    for index, tool in enumerate(tools or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            _check_function_tool(tool, f"tools[{index}].function")
            functions.append(tool)
        elif kind in SERVER_TOOL_TYPES:
            continue
        else:
            raise InvalidRequestError(
                f"Unknown tool type {kind!r}; expected function, web_search, web_fetch or "
                "code_interpreter.",
                code="invalid_value",
                param="tools",
            )
    return functions


def _check_function_tool(tool: dict[str, Any], param: str) -> None:
    function = tool.get("function")
    if not isinstance(function, dict):
        raise InvalidRequestError(
            "A function tool needs a 'function' object: {name, description?, parameters?}.",
            code="invalid_value",
            param=param,
        )
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(
            "A function tool needs a non-empty string 'name'.",
            code="invalid_value",
            param=f"{param}.name",
        )


def apply_harmony_strict(
    tools: list[dict[str, Any]], tool_choice: Any, model: CatalogModel
) -> list[dict[str, Any]]:
    """docs/reference/chat.md#reasoning-effort: Harmony models get strict function tools unless
    opted out.

    ``tools`` are function tools already checked by ``check_tools``.
    """
    if model.reasoning.format != "harmony" or not tools:
        return tools
    if tool_choice not in (None, "auto"):
        return tools
    if any("strict" in t["function"] or "strict" in t for t in tools):
        return tools
    strict = copy.deepcopy(tools)
    for tool in strict:
        tool["function"]["strict"] = True
    return strict


async def prepare_messages(
    messages: list[ChatMessage], model: CatalogModel, policy: ImagePolicy
) -> list[dict[str, Any]]:
    """Plain dicts for the engine; images decoded/fetched and re-encoded by bytes."""
    accepts_images = "image" in model.input_modalities
    fetcher = ImageFetcher(policy)
    images = 0
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        data = message.model_dump(exclude_none=True)
        if isinstance(message.content, list):
            parts: list[dict[str, Any]] = []
            for j, part in enumerate(message.content):
                param = f"messages[{i}].content[{j}]"
                dumped = part.model_dump(exclude_none=True)
                if part.type == "image_url":
                    images += 1
                    limit = model.max_images_per_request
                    if limit is not None and images > limit:
                        raise InvalidRequestError(
                            f"The model '{model.id}' takes at most {limit} images per request.",
                            code="invalid_image",
                            param=param,
                        )
                    if part.image_url is None:
                        raise InvalidRequestError(
                            "image_url parts need an image_url object.",
                            code="invalid_image",
                            param=param,
                        )
                    # A broken image is named as such whatever the model (invalid_image);
                    # only a good one on a text-only model is an unsupported input.
                    uri = await fetcher.resolve(part.image_url.url, f"{param}.image_url")
                    if not accepts_images:
                        raise InvalidRequestError(
                            f"The model '{model.id}' does not accept image input.",
                            code="unsupported_parameter",
                            param=param,
                        )
                    dumped["image_url"] = {**dumped["image_url"], "url": uri}
                parts.append(dumped)
            data["content"] = parts
        out.append(data)
    return out


_GRAMMAR_FIELDS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice")


def check_structured_outputs(extra: dict[str, Any], model: CatalogModel) -> None:
    """400 for grammar-constrained output on a model whose catalog entry cannot deliver it
    (``honours_structured_outputs``): the answer would ignore the format, silently."""
    if honours_structured_outputs(model):
        return
    fmt = extra.get("response_format")
    asked = [name for name in _GRAMMAR_FIELDS if extra.get(name) is not None]
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        asked.insert(0, "response_format")
    if asked:
        raise InvalidRequestError(
            f"The model '{model.id}' does not support structured outputs ({asked[0]}).",
            code="unsupported_parameter",
            param=asked[0],
        )


async def translate_chat(
    body: ChatCompletionRequest, model: CatalogModel, policy: ImagePolicy
) -> Translated:
    max_tokens, param = body.requested_max_tokens()
    _check_common(body, model, max_tokens, param)
    ignored: list[str] = []
    reasoning = translate_reasoning_effort(body.reasoning_effort, model)
    if reasoning.ignored:
        ignored.append("reasoning_effort")
    extra = body.relayed_extras()
    check_structured_outputs(extra, model)
    raw_kwargs = extra.pop("chat_template_kwargs", None)
    if raw_kwargs is not None and not isinstance(raw_kwargs, dict):
        raise InvalidRequestError(
            "chat_template_kwargs must be an object.",
            code="invalid_value",
            param="chat_template_kwargs",
        )
    template_kwargs: dict[str, Any] = dict(raw_kwargs or {})
    template_kwargs.update(reasoning.chat_template_kwargs)
    if reasoning.relayed_effort is not None:
        template_kwargs["reasoning_effort"] = reasoning.relayed_effort
    tools = apply_harmony_strict(check_tools(body.tools), body.tool_choice, model)
    prompt = PromptSpec(
        kind="chat",
        messages=await prepare_messages(body.messages, model, policy),
        tools=tools or None,
        tool_choice=body.tool_choice if tools else None,
        chat_template_kwargs=template_kwargs,
    )
    head_request = HeadRequest(
        request_id=new_request_id("chatcmpl"),
        prompts=[prompt],
        sampling=_sampling(body, extra),
        max_tokens=max_tokens,
        max_tokens_param=param,
        max_output_tokens=model.max_output_tokens or 0,
        prompt_param="messages",
        stream=bool(body.stream),
    )
    return Translated(head_request, ignored)


def translate_completion(body: CompletionRequest, model: CatalogModel) -> Translated:
    _check_common(body, model, body.max_tokens, "max_tokens")
    prompts = [PromptSpec(kind="completion", prompt=p) for p in body.prompts()]
    head_request = HeadRequest(
        request_id=new_request_id("cmpl"),
        prompts=prompts,
        sampling=_sampling(body, body.relayed_extras()),
        max_tokens=body.max_tokens,
        max_tokens_param="max_tokens",
        max_output_tokens=model.max_output_tokens or 0,
        prompt_param="prompt",
        stream=bool(body.stream),
    )
    return Translated(head_request)
