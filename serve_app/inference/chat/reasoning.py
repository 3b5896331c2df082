"""``reasoning_effort`` translation per model kind (docs/reference/chat.md#reasoning-effort).

Three model kinds exist: a controllable model reads
``chat_template_kwargs.enable_thinking``; a Harmony-format model reads the grade
itself; any other model has no control and the field is dropped (and named in
``x-service-ignored-params``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from serve_app.catalog.config import CatalogModel
from serve_app.protocol.errors import InvalidRequestError

# Accepted grades (docs/reference/chat.md#reasoning-effort: none, off, minimal, and
# the rest as in the OpenAI API). ``off`` is a synonym of ``none``.
REASONING_GRADES = frozenset({"none", "off", "minimal", "low", "medium", "high"})


@dataclass
class ReasoningDecision:
    """What to send to the engine and what to report as dropped."""

    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    relayed_effort: str | None = None
    ignored: bool = False


def translate_reasoning_effort(
    effort: str | None, model: CatalogModel, param: str = "reasoning_effort"
) -> ReasoningDecision:
    if effort is None:
        return ReasoningDecision()
    grade = effort.strip().lower()
    if grade not in REASONING_GRADES:
        raise InvalidRequestError(
            f"Invalid value for {param}: '{effort}'. Accepted: "
            + ", ".join(sorted(REASONING_GRADES))
            + ".",
            code="invalid_value",
            param=param,
        )
    off = grade in ("none", "off")
    if model.reasoning.controllable:
        return ReasoningDecision(chat_template_kwargs={"enable_thinking": not off})
    if model.reasoning.format == "harmony":
        if off:
            return ReasoningDecision(ignored=True)
        return ReasoningDecision(relayed_effort="low" if grade == "minimal" else grade)
    return ReasoningDecision(ignored=True)
