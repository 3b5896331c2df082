"""``gateway usage --user U [--since DATE]``: a user's usage per model, with cost.

Reads the usage ledger in the SQL database. Records reach it from each
replica's spool within ``ledger.flush_interval_s`` (a second by default), so the
last moments of traffic may not be counted yet.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from serve_app.auth.accounts import AccountStore
from serve_app.billing.store import LedgerStore, ModelTotals
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database

_SubParsers = Any  # argparse's _SubParsersAction is private and generic

_COLUMNS = ("MODEL", "REQUESTS", "PROMPT", "COMPLETION", "CACHED", "REASONING", "COST")


def _date(text: str) -> datetime:
    try:
        day = datetime.strptime(text, "%Y-%m-%d")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD, got {text!r}") from None
    return day.replace(tzinfo=UTC)


def register(subparsers: _SubParsers) -> None:
    parser = subparsers.add_parser(
        "usage",
        help="a user's usage per model and its cost, from the usage ledger",
        description="Print totals per model (requests, tokens, cost) for one user.",
    )
    parser.add_argument("--user", required=True, help="user name (or user id)")
    parser.add_argument(
        "--since",
        type=_date,
        default=None,
        help="first day counted, YYYY-MM-DD (UTC midnight); default: all time",
    )
    parser.set_defaults(handler=_usage)


def _usage(args: argparse.Namespace, settings: GatewaySettings) -> int:
    db = Database.from_settings(settings)
    try:
        db.migrate()
        user = AccountStore(db, pepper=settings.key_pepper).get_user(args.user)
        user_id = user.id if user is not None else args.user
        totals = LedgerStore(db).totals(user_id, since=args.since)
    finally:
        db.dispose()
    since = f" since {args.since:%Y-%m-%d} (UTC)" if args.since else ""
    if not totals:
        print(f"No usage recorded for user {args.user!r}{since}.")
        return 0
    print(f"Usage of user {args.user!r}{since}:")
    rows = [_row(t.model, [t], t.currency) for t in totals]
    for currency in sorted({t.currency for t in totals}):
        rows.append(_row("TOTAL", [t for t in totals if t.currency == currency], currency))
    print(_table([list(_COLUMNS), *rows]))
    return 0


def _row(label: str, totals: list[ModelTotals], currency: str) -> list[str]:
    def total(name: str) -> int:
        return sum(int(getattr(t, name)) for t in totals)

    cost = sum(t.cost for t in totals)
    return [
        label,
        str(total("requests")),
        str(total("prompt_tokens")),
        str(total("completion_tokens")),
        str(total("cached_tokens")),
        str(total("reasoning_tokens")),
        f"{cost:.6f} {currency}",
    ]


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
    return "\n".join(lines)
