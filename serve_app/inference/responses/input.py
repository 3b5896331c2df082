"""Request rules of docs/reference/responses.md#request: from a ``ResponsesRequest`` to chat
messages and tools.

The responses route shares the chat head, so its items become chat messages:
``instructions`` the first system turn, ``developer`` a system turn,
``function_call`` items assistant ``tool_calls`` and ``function_call_output``
items ``tool`` turns with the same ``call_id`` (an output for an unknown
call_id is a 400: the route is stateless, so the call must be in the input).
Output items of an earlier response that carry no conversation
(``reasoning``, ``*_call``) are accepted and skipped, so a client can send a
previous ``output`` back as input. Images are fetched and validated here,
with ``param`` naming the input part.
"""

from __future__ import annotations

import json
from typing import Any

from serve_app.catalog.config import CatalogModel
from serve_app.inference.images import ImageFetcher, ImagePolicy
from serve_app.protocol.errors import InvalidRequestError
from serve_app.protocol.responses import ResponsesRequest
from serve_app.tools.declarations import SERVER_TOOL_TYPES

EFFORTS = ("none", "minimal", "low", "medium", "high")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_SKIPPED_ITEMS = frozenset(
    {"reasoning", "web_search_call", "web_fetch_call", "code_interpreter_call"}
)
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_UNSUP = "unsupported_parameter"
_FORCED_BUILT_IN = (
    "tool_choice may not force a built-in tool; use auto, none, required or a function."
)


def _text(value: Any) -> str | None:
    """A ``type`` as sent, when it is a string (any JSON value may arrive there)."""
    return value if isinstance(value, str) else None


def _bad(message: str, param: str, code: str = "invalid_value") -> InvalidRequestError:
    return InvalidRequestError(message, code=code, param=param)


def check_request_rules(body: ResponsesRequest, model: CatalogModel) -> None:
    """The refusals of docs/reference/responses.md#request that need only the body and the
    model (the optional fields are ``responses.options``')."""
    if body.store:
        raise _bad("store=true is not supported: this route is stateless.", "store", _UNSUP)
    if body.previous_response_id is not None:
        raise _bad(
            "previous_response_id is not supported: send the whole conversation as input.",
            "previous_response_id",
            _UNSUP,
        )
    cap = model.max_output_tokens
    if body.max_output_tokens is not None and cap is not None and body.max_output_tokens > cap:
        raise _bad(
            f"max_output_tokens is too large: {body.max_output_tokens}. This model supports "
            f"at most {cap} output tokens.",
            "max_output_tokens",
        )


def reasoning_kwargs(body: ResponsesRequest, model: CatalogModel) -> dict[str, Any]:
    """``reasoning.effort`` -> ``enable_thinking`` on controllable models, else a 400."""
    reasoning = body.reasoning
    if reasoning is None:
        return {}
    if reasoning.effort is None:
        return {}
    if reasoning.effort not in EFFORTS:
        raise _bad(f"reasoning.effort must be one of {', '.join(EFFORTS)}.", "reasoning.effort")
    if not model.reasoning.controllable:
        raise _bad(f"The model '{model.id}' has no reasoning control.", "reasoning.effort", _UNSUP)
    return {"enable_thinking": reasoning.effort != "none"}


def convert_tool_choice(choice: str | dict[str, Any] | None) -> Any:
    """Relayed in chat form; forcing a built-in tool, in any spelling, is a 400.

    The built-in tools are run by the gateway's loop, which decides when the
    model may call them; ``{type: 'function', name: 'web_search'}`` names one
    just as ``{type: 'web_search'}`` or ``'web_search'`` does.
    """
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        raise _bad(
            "tool_choice of type allowed_tools is not supported; use auto, none, required "
            "or a function.",
            "tool_choice",
            _UNSUP,
        )
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name") or (choice.get("function") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise _bad("tool_choice of type function needs a name.", "tool_choice")
        if name in SERVER_TOOL_TYPES:
            raise _bad(_FORCED_BUILT_IN, "tool_choice", _UNSUP)
        return {"type": "function", "function": {"name": name}}
    if isinstance(choice, str) and choice not in SERVER_TOOL_TYPES:
        raise _bad("tool_choice must be auto, none, required or a function.", "tool_choice")
    raise _bad(_FORCED_BUILT_IN, "tool_choice", _UNSUP)


def flatten_functions(tools: list[dict[str, Any]], indexes: list[int]) -> list[dict[str, Any]]:
    """Responses function tools ``{type, name, parameters}`` in the chat template's form."""
    out = []
    for tool, index in zip(tools, indexes, strict=True):
        nested = tool.get("function")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else tool
        name = inner.get("name")
        if not isinstance(name, str) or not name:
            raise _bad("function tools need a name.", f"tools[{index}].name")
        parameters = inner.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise _bad(
                "function parameters must be a JSON Schema object.", f"tools[{index}].parameters"
            )
        function: dict[str, Any] = {"name": name}
        for key in ("description", "parameters", "strict"):
            if inner.get(key) is not None:
                function[key] = inner[key]
        out.append({"type": "function", "function": function})
    return out


async def convert_input(
    body: ResponsesRequest, model: CatalogModel, policy: ImagePolicy
) -> list[dict[str, Any]]:
    """Chat messages for the head, instructions first."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
        return messages
    converter = _ItemConverter(model, ImageFetcher(policy), messages)
    for index, item in enumerate(body.input):
        await converter.add(item, f"input[{index}]")
    return messages


class _ItemConverter:
    def __init__(
        self, model: CatalogModel, fetcher: ImageFetcher, messages: list[dict[str, Any]]
    ) -> None:
        self.model = model
        self.fetcher = fetcher
        self.messages = messages
        self.images = 0
        self.call_ids: set[str] = set()

    async def add(self, item: dict[str, Any], param: str) -> None:
        kind = _text(item.get("type", "message" if "role" in item else None))
        if kind == "message":
            await self._message(item, param)
        elif kind == "function_call":
            self._function_call(item, param)
        elif kind == "function_call_output":
            self._function_output(item, param)
        elif kind not in _SKIPPED_ITEMS:
            raise _bad(
                f"Unknown input item type {kind!r}; expected message, function_call or "
                "function_call_output.",
                f"{param}.type",
            )

    async def _message(self, item: dict[str, Any], param: str) -> None:
        role = _ROLES.get(str(item.get("role")))
        if role is None:
            raise _bad("role must be user, assistant, system or developer.", f"{param}.role")
        content = item.get("content")
        if isinstance(content, str):
            self.messages.append({"role": role, "content": content})
            return
        if not isinstance(content, list):
            raise _bad("content must be a string or a list of parts.", f"{param}.content")
        parts = [await self._part(p, f"{param}.content[{j}]") for j, p in enumerate(content)]
        if all(p["type"] == "text" for p in parts):
            self.messages.append({"role": role, "content": "".join(p["text"] for p in parts)})
        else:
            self.messages.append({"role": role, "content": parts})

    async def _part(self, part: Any, param: str) -> dict[str, Any]:
        kind = _text(part.get("type")) if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            return {"type": "text", "text": part["text"]}
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return {"type": "text", "text": part["refusal"]}
        if kind != "input_image":
            raise _bad("Content parts are input_text, output_text or input_image.", param)
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise _bad("input_image needs an image_url (file ids are not supported).", param)
        if "image" not in self.model.input_modalities:
            raise _bad(f"The model '{self.model.id}' does not accept image input.", param, _UNSUP)
        self.images += 1
        limit = self.model.max_images_per_request
        if limit is not None and self.images > limit:
            message = f"The model '{self.model.id}' takes at most {limit} images per request."
            raise InvalidRequestError(message, code="invalid_image", param=param)
        uri = await self.fetcher.resolve(url, f"{param}.image_url")
        return {"type": "image_url", "image_url": {"url": uri}}

    def _function_call(self, item: dict[str, Any], param: str) -> None:
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not call_id:
            raise _bad("function_call items need a call_id.", f"{param}.call_id")
        if not isinstance(name, str) or not name:
            raise _bad("function_call items need a name.", f"{param}.name")
        arguments = item.get("arguments", "")
        if not isinstance(arguments, str):  # the wire form is a JSON string; accept an object
            arguments = json.dumps(arguments)
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        self.call_ids.add(call_id)
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and isinstance(last["content"], str):
            last.setdefault("tool_calls", []).append(call)
        else:
            self.messages.append({"role": "assistant", "content": "", "tool_calls": [call]})

    def _function_output(self, item: dict[str, Any], param: str) -> None:
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or call_id not in self.call_ids:
            raise _bad(
                "function_call_output must answer a function_call item of the same input "
                "(matching call_id).",
                f"{param}.call_id",
            )
        output = item.get("output", "")
        if isinstance(output, list):
            output = "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": str(output)})
