"""Published JSON Schemas of ``tools`` entries (chat and responses requests).

The request models keep ``tools`` as plain objects: the entries are checked by
the code that acts on them (``serve_app.inference.chat.translate``,
``serve_app.tools.declarations``, ``serve_app.inference.responses.input``), with
errors that name the entry. These schemas state the same rules for the OpenAPI
document, so a client (or a fuzzer) reading it knows that ``tools: [{}]`` is
refused: every entry has a known ``type``; a function carries a non-empty name;
``max_uses`` is an integer >= 1; ``search_context_size`` belongs to web_search
and ``timeout_s`` to code_interpreter only. Unknown keys are tolerated, as the
server tolerates them.
"""

from __future__ import annotations

from typing import Any

_NAME = {"type": "string", "minLength": 1}
_FUNCTION_BODY: dict[str, Any] = {
    "name": _NAME,
    "description": {"type": "string"},
    "parameters": {"type": "object"},
    "strict": {"type": "boolean"},
}
_MAX_USES = {"type": "integer", "minimum": 1, "description": "Calls allowed per request."}
_SIZE = {"type": "string", "enum": ["low", "medium", "high"]}
_TIMEOUT = {"type": "number", "description": "Seconds per run (clamped to the sandbox's bounds)."}


def _server_tool(kind: str, **own: Any) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "type": {"type": "string", "const": kind},
        "max_uses": _MAX_USES,
        "search_context_size": False,
        "timeout_s": False,
    }
    properties.update(own)
    return {"type": "object", "required": ["type"], "properties": properties}


SERVER_TOOLS: list[dict[str, Any]] = [
    _server_tool("web_search", search_context_size=_SIZE),
    _server_tool("web_fetch"),
    _server_tool("code_interpreter", timeout_s=_TIMEOUT),
]

CHAT_FUNCTION_TOOL: dict[str, Any] = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"type": "string", "const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": _FUNCTION_BODY},
    },
}

RESPONSES_FUNCTION_TOOL: dict[str, Any] = {
    "type": "object",
    "required": ["type", "name"],
    "properties": {"type": {"type": "string", "const": "function"}, **_FUNCTION_BODY},
}


def tools_schema(function_tool: dict[str, Any]) -> dict[str, Any]:
    """``tools``: null or a list of function and server tool entries."""
    entries = {"anyOf": [function_tool, *SERVER_TOOLS]}
    return {"anyOf": [{"type": "array", "items": entries}, {"type": "null"}]}
