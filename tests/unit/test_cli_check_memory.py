"""`gateway check` weighs the catalog's heads against GATEWAY_MEMORY_BUDGET."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.catalog.config import CatalogModel
from serve_app.cli.check.memory import check_memory, memory_summary
from serve_app.settings import (
    STACK_RESERVE_GIB,
    GatewaySettings,
    machine_memory_gib,
    parse_gib,
)

SLEEPS = {"num_replicas": None, "autoscaling_config": {"min_replicas": 0, "max_replicas": 1}}


def _model(model_id: str, gib: float | None, **extra: Any) -> CatalogModel:
    fields: dict[str, Any] = {
        "id": model_id,
        "head": "pooling",
        "context_length": 256,
        "output_modalities": ["embedding"],
        "pooling": {"dimensions": 8},
        "memory_gib": gib,
    }
    return CatalogModel.model_validate(fields | extra)


def test_a_head_bigger_than_the_budget_is_flagged() -> None:
    models = [_model("small", 1.0, deployment=SLEEPS), _model("big", 9.0, deployment=SLEEPS)]
    problems = check_memory(models, budget_gib=8)
    assert [p.subject for p in problems] == ["model big"]
    assert "more than the whole budget" in problems[0].problem
    assert "GATEWAY_MEMORY_BUDGET" in problems[0].fix
    assert check_memory(models, budget_gib=10) == []


def test_a_sleeping_head_that_never_fits_beside_the_never_sleeping_ones_is_flagged() -> None:
    models = [
        _model("always", 5.0),  # fixed replicas: never sleeps
        _model("tools", 4.0, deployment=SLEEPS),
    ]
    problems = check_memory(models, budget_gib=8)
    assert [p.subject for p in problems] == ["model tools"]
    assert "never wake" in problems[0].problem
    assert check_memory(models, budget_gib=9) == []


def test_a_pin_is_kept_only_while_it_fits_beside_the_largest_sleeping_head() -> None:
    models = [
        _model("pinned", 3.0, pinned=True, deployment=SLEEPS),
        _model("always", 2.0),  # fixed replicas: never sleeps
        _model("tools", 4.0, deployment=SLEEPS),
    ]
    assert check_memory(models, budget_gib=9) == []
    lines = memory_summary(models, 9)
    assert "always awake (pinned or never sleeping) 5.0 GiB" in lines[0]
    assert "all awake at once 9.0 GiB" in lines[0]
    assert "pinned awake: pinned" in lines
    # 2 + 3 + 4 = 9 > 8: kept, the pin would leave tools no room ever; dropped, all fit
    assert check_memory(models, budget_gib=8) == []
    lines = memory_summary(models, 8)
    assert "always awake (pinned or never sleeping) 2.0 GiB" in lines[0]
    assert not any(line.startswith("pinned awake") for line in lines)
    assert (
        "pin of pinned dropped: 9.0 GiB with the largest sleeping head, over the budget; "
        "it is put to sleep when another head needs its room"
    ) in lines


def test_always_awake_heads_over_the_budget_are_flagged() -> None:
    problems = check_memory([_model("a", 3.0), _model("b", 3.0)], budget_gib=5)
    assert [p.subject for p in problems] == ["memory budget"]


def test_undeclared_footprints_are_named() -> None:
    lines = memory_summary([_model("x", None, deployment=SLEEPS)], 8)
    assert lines[-1] == "no memory_gib declared (counted as 0): x"


@pytest.mark.parametrize(
    ("text", "gib"), [("8G", 8.0), ("12GiB", 12.0), ("8192M", 8.0), ("7.5", 7.5), ("1T", 1024.0)]
)
def test_budget_sizes(text: str, gib: float) -> None:
    assert parse_gib(text) == gib
    assert GatewaySettings(memory_budget=text).resolved_memory_budget_gib() == gib


def test_budget_defaults_to_half_the_machine_less_the_stack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATEWAY_MEMORY_BUDGET", raising=False)
    half = machine_memory_gib() / 2
    expected = max(half - STACK_RESERVE_GIB, half / 2)
    assert GatewaySettings().resolved_memory_budget_gib() == pytest.approx(expected)
    monkeypatch.setenv("GATEWAY_MEMORY_BUDGET", "8G")
    assert GatewaySettings().resolved_memory_budget_gib() == 8.0


@pytest.mark.parametrize("text", ["lots", "8X", "G", "-1G"])
def test_bad_budget_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        GatewaySettings(memory_budget=text)


@pytest.mark.parametrize(("machine", "budget"), [(24.0, 10.3), (16.0, 6.3), (4.0, 1.0)])
def test_the_default_leaves_the_stack_its_share(
    monkeypatch: pytest.MonkeyPatch, machine: float, budget: float
) -> None:
    """24 GiB: the heads get 10.3 so the whole stack stays inside 12; a small machine keeps
    a quarter for the heads rather than nothing."""
    import serve_app.settings as settings

    monkeypatch.delenv("GATEWAY_MEMORY_BUDGET", raising=False)
    monkeypatch.setattr(settings, "machine_memory_gib", lambda: machine)
    assert GatewaySettings().resolved_memory_budget_gib() == pytest.approx(budget)
