"""Server-tool declarations: parsing, budgets, entitlement (docs/reference/chat.md#server-tools,
docs/reference/common.md#limits).

Both routes declare tools the same way (``web_search``, ``web_fetch``,
``code_interpreter`` entries in ``tools``; chat also has
``web_search_options``), so one parser turns them into a ``ServerToolPlan``:
which tools the model may call and how often. ``max_uses`` only lowers the
spec's per-request defaults and ``timeout_s`` only tightens the code run limit,
so a client can never buy more than the operator allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from serve_app.auth.principal import Principal
from serve_app.catalog.config import CatalogModel
from serve_app.protocol.errors import InvalidRequestError, PermissionDeniedError

SERVER_TOOL_TYPES = ("web_search", "web_fetch", "code_interpreter")
DEFAULT_BUDGETS = {"web_search": 6, "web_fetch": 3, "code_interpreter": 4}
RESULTS_PER_SEARCH = {"low": 3, "medium": 5, "high": 8}
CODE_TIMEOUT_MIN_S = 5.0
CODE_TIMEOUT_MAX_S = 20.0
CODE_SECONDS_PER_REQUEST = 45.0
_FLAGS = {
    "web_search": "web_search_enabled",
    "web_fetch": "web_fetch_enabled",
    "code_interpreter": "code_interpreter_enabled",
}


@dataclass
class ServerToolPlan:
    """What the loop may run for one request; empty when no server tool is declared."""

    budgets: dict[str, int] = field(default_factory=dict)
    results_per_search: int = RESULTS_PER_SEARCH["medium"]
    code_timeout_s: float = CODE_TIMEOUT_MAX_S

    @property
    def declared(self) -> bool:
        return bool(self.budgets)

    def allows(self, name: str) -> bool:
        return name in self.budgets

    @property
    def cites(self) -> bool:
        """Answers may cite sources (``[n]`` markers become annotations)."""
        return "web_search" in self.budgets or "web_fetch" in self.budgets


def _bad(message: str, param: str, code: str = "invalid_value") -> InvalidRequestError:
    return InvalidRequestError(message, code=code, param=param)


def split_tools(
    tools: list[Any] | None,
) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any]]]]:
    """``(function tools, (index, server tool))``; any other type is a 400 naming ``tools``."""
    functions: list[dict[str, Any]] = []
    servers: list[tuple[int, dict[str, Any]]] = []
    for i, tool in enumerate(tools or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            functions.append(tool)
        elif kind in SERVER_TOOL_TYPES:
            servers.append((i, tool))
        else:
            raise _bad(
                f"Unknown tool type {kind!r}; expected function, web_search, web_fetch or "
                "code_interpreter.",
                "tools",
            )
    return functions, servers


def _search_size(value: Any, param: str) -> str:
    if not isinstance(value, str) or value not in RESULTS_PER_SEARCH:
        raise _bad("search_context_size must be low, medium or high.", param)
    return str(value)


def _max_uses(tool: dict[str, Any], kind: str, param: str) -> int:
    value = tool.get("max_uses")
    if value is None:
        return DEFAULT_BUDGETS[kind]
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON Schema's integer (the published document) includes 2.0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad("max_uses must be an integer >= 1.", f"{param}.max_uses")
    return min(value, DEFAULT_BUDGETS[kind])


def _timeout(tool: dict[str, Any], param: str) -> float:
    value = tool.get("timeout_s")
    if value is None:
        return CODE_TIMEOUT_MAX_S
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise _bad("timeout_s must be a number of seconds.", f"{param}.timeout_s")
    return min(max(float(value), CODE_TIMEOUT_MIN_S), CODE_TIMEOUT_MAX_S)


def _settings(kind: str, tool: dict[str, Any], param: str) -> dict[str, Any]:
    """The effective settings of one entry, for budgets and duplicate comparison."""
    if "search_context_size" in tool and kind != "web_search":
        raise _bad(
            "search_context_size applies to web_search only.", f"{param}.search_context_size"
        )
    if "timeout_s" in tool and kind != "code_interpreter":
        raise _bad("timeout_s applies to code_interpreter only.", f"{param}.timeout_s")
    settings: dict[str, Any] = {"max_uses": _max_uses(tool, kind, param)}
    if kind == "web_search" and "search_context_size" in tool:
        settings["size"] = _search_size(tool["search_context_size"], f"{param}.search_context_size")
    if kind == "code_interpreter":
        settings["timeout_s"] = _timeout(tool, param)
    return settings


def build_plan(
    servers: list[tuple[int, dict[str, Any]]],
    web_search_options: dict[str, Any] | None = None,
) -> ServerToolPlan:
    """Merge declarations: agreeing duplicates merge, disagreeing ones are a 400."""
    seen: dict[str, dict[str, Any]] = {}
    for index, tool in servers:
        kind = str(tool["type"])
        param = f"tools[{index}]"
        settings = _settings(kind, tool, param)
        if kind in seen and seen[kind] != settings:
            raise _bad(f"{kind} is declared twice with different settings.", param)
        seen[kind] = settings
    if web_search_options is not None:
        _merge_search_options(seen, web_search_options)
    plan = ServerToolPlan(budgets={kind: s["max_uses"] for kind, s in seen.items()})
    if "web_search" in seen:
        plan.results_per_search = RESULTS_PER_SEARCH[seen["web_search"].get("size", "medium")]
    if "code_interpreter" in seen:
        plan.code_timeout_s = seen["code_interpreter"]["timeout_s"]
    return plan


def _merge_search_options(seen: dict[str, dict[str, Any]], options: dict[str, Any]) -> None:
    """``web_search_options`` is the same switch as a ``web_search`` tool
    (docs/reference/chat.md#chat-request)."""
    param = "web_search_options.search_context_size"
    size = (
        _search_size(options["search_context_size"], param)
        if ("search_context_size" in options)
        else None
    )
    current = seen.get("web_search")
    if current is None:
        seen["web_search"] = {"max_uses": DEFAULT_BUDGETS["web_search"]}
        if size is not None:
            seen["web_search"]["size"] = size
        return
    if size is not None and current.get("size", size) != size:
        raise _bad("web_search_options disagrees with the web_search tool.", param)
    if size is not None:
        current["size"] = size


def check_entitlements(plan: ServerToolPlan, principal: Principal, model: CatalogModel) -> None:
    """docs/reference/chat.md#server-tools: a model with native tool calling (400), then the account
    flag (403)."""
    if not plan.declared:
        return
    if not model.native_tool_calling:
        raise InvalidRequestError(
            f"The model '{model.id}' has no native tool calling, so it cannot use server tools.",
            code="unsupported_parameter",
            param="tools",
        )
    for kind in plan.budgets:
        if not getattr(principal, _FLAGS[kind]):
            raise PermissionDeniedError(
                f"Your account is not enabled for the {kind} tool.",
                code="insufficient_permissions",
                param="tools",
            )


def check_name_clash(functions: list[dict[str, Any]], plan: ServerToolPlan) -> None:
    """A client function may not shadow a declared server tool (the call would be ambiguous)."""
    for tool in functions:
        function = tool.get("function")  # shape checked later by translate.check_tools
        name = (function.get("name") if isinstance(function, dict) else None) or tool.get("name")
        if name in plan.budgets:
            raise _bad(
                f"A function tool may not be named '{name}' next to that server tool.", "tools"
            )
