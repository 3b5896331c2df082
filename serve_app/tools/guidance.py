"""What the model is told about server tools: function schemas and guidance text.

Server tools reach the model as ordinary function declarations (the chat
template renders them like client functions), plus a short guidance paragraph
merged into the system turn (the ``instructions`` on the responses route) that
says when to call each one and when to answer without a tool. How to cite
(``[n]``, which the gateway turns into ``url_citation`` annotations) is said with
the numbered results themselves (``CITATION_RULE``), never before a source exists.

What ``web_search`` searches depends on the provider: SearXNG and Brave search the
live web, the ``local`` provider only the pages an operator indexed on this service.
The model is told which (``SearchScope``), so it neither promises users fresh web
results from a fixed collection nor gives up on questions the collection answers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from serve_app.contract.chat import HeadRequest
from serve_app.tools.declarations import ServerToolPlan

SearchScope = Literal["web", "local"]
"""Where ``web_search`` looks: the live web, or the local index of this service."""

_RESULTS = "Returns numbered results [n] with title, URL and snippet."
_SEARCH_DESCRIPTIONS: dict[SearchScope, str] = {
    "web": f"Search the web. {_RESULTS}",
    "local": "Search the pages indexed on this service (a fixed local collection, not the "
    f"live web). {_RESULTS}",
}
_SEARCH_GUIDANCE: dict[SearchScope, str] = {
    "web": "web_search to look things up on the web",
    "local": "web_search to look things up in the pages indexed on this service "
    "(a local collection, not the live web)",
}

_SCHEMAS: dict[str, dict[str, Any]] = {
    "web_search": {
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "The search query."}},
            "required": ["query"],
        },
    },
    "web_fetch": {
        "description": "Fetch a web page by URL and return its text, numbered [n] as a source.",
        "parameters": {
            "type": "object",
            "properties": {"url": {"type": "string", "description": "An http(s) URL."}},
            "required": ["url"],
        },
    },
    "code_interpreter": {
        "description": "Run a Python 3 program in a fresh sandbox and return what it "
        "printed (and, as in a notebook, the value of a final expression). Nothing persists "
        "between runs; print the results you need.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source."}},
            "required": ["code"],
        },
    },
}

_GUIDANCE = {
    "web_fetch": "web_fetch to read a page",
    "code_interpreter": "code_interpreter to run Python (print what you need)",
}
_WHEN = {
    "web_search": "Call web_search when the user asks you to search, look up, find or check "
    "something, or asks about news, recent events or facts that change over time (who holds "
    "an office, the latest version or winner, opening hours) that no other tool provides; do "
    "not answer those from memory.",
    "web_fetch": "Call web_fetch to read a URL the user gives.",
}
_ANSWER_DIRECTLY = (
    "Answer directly, without a tool, when none is needed: greetings, thanks, arithmetic, "
    "writing, translation, code and stable general knowledge (definitions, capitals, history)."
)

CITATION_RULE = (
    "Cite a fact you use from these results right after the claim with its number in "
    "brackets, e.g. [1] or [1][3]; never cite a number not listed here."
)
"""Closes every search result and fetched page the model reads. The first turn says
nothing of markers: told about ``[1]`` before any source exists, Qwen2.5-Coder-1.5B
answered a bare ``[1]`` instead of calling a tool (bench/tool_decisions.py)."""
NO_SOURCES = "No results, so there is nothing to cite: write no [n] markers."


def _schema(name: str, search_scope: SearchScope) -> dict[str, Any]:
    if name == "web_search":
        return {"description": _SEARCH_DESCRIPTIONS[search_scope], **_SCHEMAS[name]}
    return _SCHEMAS[name]


def tool_schemas(
    plan: ServerToolPlan, names: list[str], *, search_scope: SearchScope
) -> list[dict[str, Any]]:
    """Chat-format function declarations of the server tools in ``names`` (declared order)."""
    return [
        {"type": "function", "function": {"name": name, **_schema(name, search_scope)}}
        for name in names
        if plan.allows(name)
    ]


def guidance_text(plan: ServerToolPlan, *, search_scope: SearchScope) -> str:
    uses = [
        _SEARCH_GUIDANCE[search_scope] if name == "web_search" else _GUIDANCE[name]
        for name in plan.budgets
    ]
    text = "You can call tools: " + "; ".join(uses) + "."
    for name in plan.budgets:
        if name in _WHEN:
            text += " " + _WHEN[name]
    return text + " " + _ANSWER_DIRECTLY


def merge_guidance(messages: list[dict[str, Any]], guidance: str) -> list[dict[str, Any]]:
    """The guidance joins the first system turn, or becomes one (never a second one)."""
    if not guidance:
        return messages
    merged = list(messages)
    first = merged[0] if merged else None
    if first is not None and first.get("role") == "system":
        content = first.get("content")
        if isinstance(content, list):
            new_content: Any = [*content, {"type": "text", "text": guidance}]
        else:
            new_content = f"{content}\n\n{guidance}" if content else guidance
        merged[0] = {**first, "content": new_content}
    else:
        merged.insert(0, {"role": "system", "content": guidance})
    return merged


def equip_request(
    request: HeadRequest,
    plan: ServerToolPlan,
    functions: list[dict[str, Any]],
    tool_choice: Any,
    *,
    search_scope: SearchScope,
) -> HeadRequest:
    """The first turn's request: guidance in the system turn, server tools after functions."""
    prompt = request.prompts[0]
    messages = list(prompt.messages or [])
    if plan.declared:
        messages = merge_guidance(messages, guidance_text(plan, search_scope=search_scope))
    tools = functions + tool_schemas(plan, list(plan.budgets), search_scope=search_scope)
    equipped = dataclasses.replace(
        prompt,
        messages=messages,
        tools=tools or None,
        tool_choice=tool_choice if tools else None,
    )
    return dataclasses.replace(request, prompts=[equipped])
