"""Keyset pagination over a table ordered by ``(created_at, id)``: the one way the
batches, files and video jobs stores list an owner's rows.

A page starts after a row named by its id (the API's ``after``), not at an offset: the
anchor's ``(created_at, id)`` is read first and the page is what sorts after it, so a
row inserted or deleted meanwhile neither repeats nor skips another (an offset would
shift by one). An anchor that is not the owner's, or no longer exists, is ignored: the
page starts at the top, as the stores did before they shared this.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping


def keyset_page(
    conn: Connection,
    table: sa.Table,
    owner: Sequence[sa.ColumnElement[bool]],
    *,
    limit: int,
    after: str | None = None,
    newest_first: bool = True,
    filters: Sequence[sa.ColumnElement[bool]] = (),
) -> tuple[list[RowMapping], bool]:
    """Up to ``limit`` of ``owner``'s rows of ``table`` after the row ``after``, and
    whether more follow.

    ``owner`` scopes both the anchor and the page (a caller never pages from another
    tenant's row); ``filters`` narrow only the page (a file's ``purpose``: the anchor
    may be a file of another purpose, whose position still counts).
    """
    created_at, row_id = table.c.created_at, table.c.id
    query = sa.select(table).where(*owner, *filters)
    if after is not None:
        anchor = conn.execute(sa.select(created_at, row_id).where(row_id == after, *owner)).first()
        if anchor is not None:
            at, anchor_id = anchor
            beyond = operator.lt if newest_first else operator.gt
            query = query.where(
                sa.or_(beyond(created_at, at), sa.and_(created_at == at, beyond(row_id, anchor_id)))
            )
    order = (created_at.desc(), row_id.desc()) if newest_first else (created_at, row_id)
    rows = list(conn.execute(query.order_by(*order).limit(limit + 1)).mappings())
    return rows[:limit], len(rows) > limit
