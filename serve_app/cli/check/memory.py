"""The catalog's heads against the memory budget (``GATEWAY_MEMORY_BUDGET``).

The budget keeper (``serve_app.heads.budget``) puts idle heads to sleep to make room for
the one being woken, but it cannot shrink a head, nor free pinned heads and heads that
never sleep: a head bigger than the budget, or bigger than what those leave, would never
wake (every call a 503 ``model_warming``). Those are problems; the summary says what the
catalog needs against the budget, and which pins it keeps: a pin is kept only while the
budget holds the pinned heads beside the largest sleeping one (``honour_pins``), else it
is dropped and the summary says so (a warning, not a problem: the head then sleeps when
another needs its room, and wakes on its next call).
"""

from __future__ import annotations

from collections.abc import Iterable

from serve_app.catalog.config import CatalogModel
from serve_app.cli.check.problems import Problem
from serve_app.heads.budget import budget_heads, honour_pins

_FIX = "raise GATEWAY_MEMORY_BUDGET (docs/deployment.md, 'Memory budget') or remove the head"


def memory_summary(models: Iterable[CatalogModel], budget_gib: float) -> list[str]:
    """What the catalog needs against the budget, in a few lines."""
    models = list(models)
    pins = honour_pins(budget_heads(models), budget_gib)
    heads = budget_heads(models, budget_gib)
    resident = sum(h.memory_gib for h in heads.values() if not h.evictable)
    total = sum(h.memory_gib for h in heads.values())
    largest = pins.largest
    lines = [
        f"memory budget {budget_gib:.1f} GiB for {len(heads)} heads: always awake (pinned or "
        f"never sleeping) {resident:.1f} GiB, all awake at once {total:.1f} GiB"
    ]
    if largest is not None:
        lines.append(
            f"largest sleeping head {largest.model_id} {largest.memory_gib:.1f} GiB: "
            f"{resident + largest.memory_gib:.1f} GiB with the always-awake heads"
        )
    if pins.kept:
        lines.append(f"pinned awake: {', '.join(pins.kept)}")
    for model_id in pins.dropped:
        need = pins.always_gib + heads[model_id].memory_gib
        need += largest.memory_gib if largest is not None else 0.0
        lines.append(
            f"pin of {model_id} dropped: {need:.1f} GiB with the largest sleeping head, over "
            f"the budget; it is put to sleep when another head needs its room"
        )
    unknown = sorted(m for m, h in heads.items() if h.memory_gib == 0)
    if unknown:
        lines.append(f"no memory_gib declared (counted as 0): {', '.join(unknown)}")
    return lines


def check_memory(models: Iterable[CatalogModel], budget_gib: float) -> list[Problem]:
    """Heads that could never wake under the budget, and always-awake heads over it."""
    heads = budget_heads(models, budget_gib)
    resident = sum(h.memory_gib for h in heads.values() if not h.evictable)
    problems: list[Problem] = []
    if resident > budget_gib:
        problems.append(
            Problem(
                "memory budget",
                f"the pinned and never-sleeping heads hold {resident:.1f} GiB, over the "
                f"{budget_gib:.1f} GiB budget",
                _FIX,
            )
        )
    for head in heads.values():
        if head.memory_gib > budget_gib:
            what = f"needs {head.memory_gib:.1f} GiB awake, more than the whole budget"
        elif head.evictable and resident + head.memory_gib > budget_gib:
            what = (
                f"needs {head.memory_gib:.1f} GiB awake beside {resident:.1f} GiB of heads "
                f"that never sleep: over the budget, it would never wake"
            )
        else:
            continue
        problems.append(Problem(f"model {head.model_id}", f"{what} ({budget_gib:.1f} GiB)", _FIX))
    return problems
