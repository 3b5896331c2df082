"""``BatchStore.result_pages``: a batch's stored results in input order, in pages bounded
by their size (one larger result alone), never all at once."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from serve_app.batches import store
from serve_app.batches.store import BatchStore, _runs
from serve_app.storage.db import Database
from serve_app.storage.schema import batch_lines


def test_runs_fit_the_budget_and_a_large_line_stands_alone() -> None:
    sizes = [(1, 40), (2, 40), (3, 40), (4, 500), (5, 10), (7, 10), (8, 95)]
    assert list(_runs(sizes, 100)) == [(1, 2), (3, 3), (4, 4), (5, 7), (8, 8)]
    assert list(_runs([(3, 0)], 100)) == [(3, 3)]


@pytest.mark.parametrize("plan", [1000, 3])
def test_pages_hold_every_line_in_order_within_the_budget(
    db: Database, plan: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``plan``: lines whose sizes one read plans (3: runs cut at the plan's edges too)."""
    monkeypatch.setattr(store, "_SIZES_PAGE", plan)
    sizes = [30, 30, 30, 250, 0, 5, 5, 90]
    rows = [
        {
            "batch_id": "batch_a",
            "line": n,
            "custom_id": f"c{n}",
            "body": "{}",
            "status": "pending" if size == 0 else "succeeded",
            "result": None if size == 0 else "r" * size,
        }
        for n, size in enumerate(sizes, 1)
    ]
    other = {**rows[0], "batch_id": "batch_b", "result": "x" * 1000}
    with db.begin() as conn:
        conn.execute(sa.insert(batch_lines), [*rows, other])
    pages = list(BatchStore(db).result_pages("batch_a", 100))
    expected = [[1, 2, 3], [4], [5, 6, 7, 8]] if plan == 1000 else [[1, 2, 3], [4], [5, 6], [7, 8]]
    assert [[line.line for line in page] for page in pages] == expected
    for page in pages:
        held = sum(len(line.result or "") for line in page)
        assert held <= 100 or len(page) == 1
    assert [line.result for page in pages for line in page][4] is None
