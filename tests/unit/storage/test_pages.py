"""Keyset pagination (serve_app/storage/pages.py), shared by the batches, files and video
jobs stores, on SQLite and PostgreSQL: ties on ``created_at`` broken by id, both orders,
an anchor scoped to its owner, filters that narrow the page but not the anchor."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from serve_app.files.store import FileRecord, FileStore
from serve_app.storage.db import Database
from serve_app.storage.pages import keyset_page
from serve_app.storage.schema import files

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _file(file_id: str, org_id: str, minute: int, purpose: str = "batch") -> FileRecord:
    return FileRecord(
        id=file_id,
        org_id=org_id,
        user_id="u",
        purpose=purpose,
        filename="a.jsonl",
        bytes=1,
        object_key=f"files/{file_id}",
        created_at=T0 + timedelta(minutes=minute),
    )


def _ids(db: Database, org: str, **kwargs: object) -> tuple[list[str], bool]:
    with db.connect() as conn:
        rows, more = keyset_page(conn, files, [files.c.org_id == org], **kwargs)  # type: ignore[arg-type]
    return [str(r["id"]) for r in rows], more


def _seed(db: Database) -> None:
    store = FileStore(db)
    # f-b and f-c share a timestamp: the id decides their order.
    for record in (
        _file("f-a", "org-1", 0),
        _file("f-b", "org-1", 1),
        _file("f-c", "org-1", 1, purpose="fine-tune"),
        _file("f-d", "org-1", 2),
        _file("f-x", "org-2", 3),
    ):
        store.insert(record)


def test_walks_every_row_once_in_either_order(db: Database) -> None:
    _seed(db)
    newest = ["f-d", "f-c", "f-b", "f-a"]
    for newest_first, expected in ((True, newest), (False, newest[::-1])):
        seen: list[str] = []
        after: str | None = None
        while True:
            page, more = _ids(db, "org-1", limit=2, after=after, newest_first=newest_first)
            seen.extend(page)
            if not more:
                break
            after = page[-1]
        assert seen == expected


def test_more_is_false_on_an_exact_fit(db: Database) -> None:
    _seed(db)
    assert _ids(db, "org-1", limit=4) == (["f-d", "f-c", "f-b", "f-a"], False)
    assert _ids(db, "org-1", limit=3) == (["f-d", "f-c", "f-b"], True)


def test_another_owners_anchor_is_ignored(db: Database) -> None:
    """org-1 cannot page from org-2's row: the page starts at the top."""
    _seed(db)
    assert _ids(db, "org-1", limit=2, after="f-x") == (["f-d", "f-c"], True)
    assert _ids(db, "org-1", limit=2, after="no-such-file") == (["f-d", "f-c"], True)


def test_filters_narrow_the_page_but_not_the_anchor(db: Database) -> None:
    _seed(db)
    batch_only = [files.c.purpose == "batch"]
    assert _ids(db, "org-1", limit=5, filters=batch_only) == (["f-d", "f-b", "f-a"], False)
    # f-c is not a batch file, yet its position is where the page starts.
    assert _ids(db, "org-1", limit=5, after="f-c", filters=batch_only) == (["f-b", "f-a"], False)
