"""Recognise an answer that is a call to a function the request never declared.

Offered tools with ``tool_choice: auto``, a small tool model sometimes answers a
question no declared tool serves by writing a call to a tool it made up:
``{"name": "multiply", "arguments": {"a": 17, "b": 23}}`` for "What is 17 times
23?" (Qwen2.5-Coder-1.5B, docs/models.md, "Tool decisions"). The tool parser
rightly leaves such text as content (the name is not one of the request's tools),
but as an answer it says nothing to the user. ``ChatHeadCore`` asks the model
again without tools when the first text of a turn looks like this.

Only the call's opening is needed: the parser holds back text that may still become a
call and releases it as content once the name is known and not declared, so the
first content delta of a streamed turn already holds ``{"name": "multiply"``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_CALL_OPENING = re.compile(
    r"""\s*(?:```[A-Za-z]*\s*)?             # an optional Markdown fence
        (?:<tool_call>|<tool_response>)?\s*  # an optional hermes tag (or the results' tag)
        \[?\s*\{\s*"(?:name|function)"\s*:\s*"(?P<name>[A-Za-z_][\w.\-]*)"
    """,
    re.VERBOSE,
)
"""The forms the lenient parser reads as calls (deployments/chat/tool_parsers.py),
up to the function's name (an identifier: prose values such as ``"Alice Smith"`` do not
match)."""


def declared_names(tools: Iterable[dict[str, Any]] | None) -> frozenset[str]:
    """Function names of chat-format (``{"function": {"name": ...}}``) or flat tools."""
    names: set[str] = set()
    for tool in tools or []:
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else tool.get("name")
        if isinstance(name, str):
            names.add(name)
    return frozenset(names)


def invented_call(text: str, declared: frozenset[str]) -> str | None:
    """The undeclared function ``text`` opens with a call to, or None.

    A call to a declared function is the parser's business (it becomes a tool
    call); text that merely contains JSON further on is an answer.
    """
    match = _CALL_OPENING.match(text)
    if match is None or match.group("name") in declared:
        return None
    return match.group("name")
