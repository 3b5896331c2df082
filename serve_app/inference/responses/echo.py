"""The request settings a Response reports: what was applied, not what was asked.

Open Responses (OpenAPI 2026-04-24) makes every ``ResponseResource`` carry the
settings it was generated with, non-null where a value applied. The gateway
knows most of them exactly. A sampling value the request omits is the
engine's: the head reports the model's ``generation_config`` values vLLM's
serving layer applies (``HeadStarted.sampling_defaults``), and where it reports
none the OpenAI defaults apply (temperature 1.0, top_p 1.0, no penalties).
An externally served model's provider defaults are not known to the gateway;
the OpenAI defaults are stated for it too (docs/api.md says so).
"""

from __future__ import annotations

from typing import Any, Literal, cast

from serve_app.catalog.config import CatalogModel
from serve_app.inference.responses.options import ResponseOptions
from serve_app.protocol.responses import (
    FunctionToolChoice,
    ReasoningEcho,
    ResponseSettings,
    ResponsesRequest,
    ServerToolEcho,
    ServerToolType,
    ToolEcho,
)
from serve_app.tools.declarations import RESULTS_PER_SEARCH, ServerToolPlan

ENGINE_DEFAULT_TEMPERATURE = 1.0
ENGINE_DEFAULT_TOP_P = 1.0
_SIZE_OF = {
    results: cast(Literal["low", "medium", "high"], size)
    for size, results in RESULTS_PER_SEARCH.items()
}
_EFFORT_ECHO = {"minimal": "low"}
"""Efforts the schema lacks, echoed as the closest grade it has (the head only switches
deliberation on or off, so ``minimal`` and ``low`` are applied identically)."""


def echo_tools(functions: list[dict[str, Any]], plan: ServerToolPlan) -> list[ToolEcho]:
    """Function tools flat (every key of the schema's FunctionTool), then the server tools
    with the budgets and limits the loop applies."""
    tools: list[ToolEcho] = []
    for entry in functions:
        function = entry["function"]
        tools.append(
            {
                "type": "function",
                "name": function["name"],
                "description": function.get("description"),
                "parameters": function.get("parameters"),
                "strict": function.get("strict"),
            }
        )
    for kind, budget in plan.budgets.items():
        tool: ServerToolEcho = {"type": cast(ServerToolType, kind), "max_uses": budget}
        if kind == "web_search":
            tool["search_context_size"] = _SIZE_OF.get(plan.results_per_search, "medium")
        if kind == "code_interpreter":
            tool["timeout_s"] = plan.code_timeout_s
        tools.append(tool)
    return tools


def echo_tool_choice(choice: Any, has_tools: bool) -> str | FunctionToolChoice:
    """The relayed choice in the Responses form; omitted means auto with tools, else none."""
    if choice is None:
        return "auto" if has_tools else "none"
    if isinstance(choice, dict):  # chat form after ``convert_tool_choice``
        return {"type": "function", "name": choice["function"]["name"]}
    return cast(str, choice)


def echo_reasoning(body: ResponsesRequest, model: CatalogModel) -> ReasoningEcho | None:
    """``{effort, summary}`` on models that deliberate or were switched; else null.

    ``effort: null`` means the model's own default; ``summary`` is never produced.
    """
    effort = body.reasoning.effort if body.reasoning is not None else None
    if effort is not None:
        return {"effort": _EFFORT_ECHO.get(effort, effort), "summary": None}
    if model.reasoning.separate_channel or model.reasoning.controllable:
        return {"effort": None, "summary": None}
    return None


def _sent_or(value: float | None, default: float) -> float:
    return value if value is not None else default


def response_settings(
    body: ResponsesRequest,
    model: CatalogModel,
    *,
    functions: list[dict[str, Any]],
    plan: ServerToolPlan,
    tool_choice: Any,
    options: ResponseOptions,
    max_output_tokens: int | None,
    engine_defaults: dict[str, float],
) -> ResponseSettings:
    """The ResponseResource fields that describe how the response was generated.

    ``engine_defaults``: what the head reported applying to omitted sampling values;
    ``options``: the optional fields as applied (``responses.options``).
    """
    tools = echo_tools(functions, plan)
    defaults = {
        "temperature": ENGINE_DEFAULT_TEMPERATURE,
        "top_p": ENGINE_DEFAULT_TOP_P,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        **engine_defaults,
    }
    return {
        "instructions": body.instructions,
        "tools": tools,
        "tool_choice": echo_tool_choice(tool_choice, bool(tools)),
        "truncation": "disabled",  # an over-long input is a 400, never cut
        "parallel_tool_calls": True,  # every call the model makes is returned
        "text": {"format": options.text_format},
        "temperature": _sent_or(body.temperature, defaults["temperature"]),
        "top_p": _sent_or(body.top_p, defaults["top_p"]),
        "presence_penalty": _sent_or(body.presence_penalty, defaults["presence_penalty"]),
        "frequency_penalty": _sent_or(body.frequency_penalty, defaults["frequency_penalty"]),
        "top_logprobs": options.top_logprobs,
        "reasoning": echo_reasoning(body, model),
        "max_output_tokens": max_output_tokens,
        "max_tool_calls": sum(plan.budgets.values()) if plan.declared else None,
        "background": False,
        "service_tier": "default",
        "safety_identifier": None,
        "prompt_cache_key": None,
    }
