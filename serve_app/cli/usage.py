"""``gateway usage --user U [--since DATE]``: a user's usage per model, with cost.

Reads the usage ledger in the SQL database. Records reach it from each
replica's spool within ``ledger.flush_interval_s`` (a second by default), so the
last moments of traffic may not be counted yet.

Every billed quantity has a column, not only tokens: a user of the speech,
detect/parse, video or server-tool routes is billed in seconds, images and
searches, and a read-out without them would not explain the cost. Batch lines
(billed at the batch discount) get their own row per model, ``MODEL (batch)``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from serve_app.auth.accounts import AccountStore
from serve_app.billing.store import LedgerStore, ModelTotals
from serve_app.cli.errors import CommandError
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database

_SubParsers = Any  # argparse's _SubParsersAction is private and generic

_Cell = Callable[[list[ModelTotals]], str]


def _count(name: str) -> _Cell:
    return lambda totals: str(sum(int(getattr(t, name)) for t in totals))


def _seconds(name: str) -> _Cell:
    return lambda totals: f"{sum(float(getattr(t, name)) for t in totals):.2f}"


_COLUMNS: tuple[tuple[str, _Cell], ...] = (
    ("REQUESTS", _count("requests")),
    ("PROMPT", _count("prompt_tokens")),
    ("COMPLETION", _count("completion_tokens")),
    ("CACHED", _count("cached_tokens")),
    ("REASONING", _count("reasoning_tokens")),
    ("SEARCHES", _count("web_searches")),
    ("CODE_S", _seconds("code_seconds")),
    ("IMAGES", _count("images")),
    ("AUDIO_S", _seconds("audio_seconds")),
    ("VIDEO_S", _seconds("video_seconds")),
)
"""Quantities after MODEL, before COST; REQUESTS counts each of ``n`` choices."""


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
        description="Print one user's totals per model from the usage ledger: requests "
        "(n choices count as n), prompt/completion/cached/reasoning tokens, web searches, "
        "code-interpreter seconds, images, audio and video seconds, and the cost at the "
        "prices applied when each request ran; batch lines, billed at the batch "
        "discount, in rows of their own (MODEL (batch)). Records reach the database within "
        "the ledger's flush interval (1 s by default).",
    )
    parser.add_argument("--user", required=True, metavar="USER", help="user name (or user id)")
    parser.add_argument(
        "--since",
        type=_date,
        default=None,
        metavar="DATE",
        help="first day counted, YYYY-MM-DD, from 00:00 UTC; default: all time",
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
        if user is None:
            raise CommandError(f"no user named {args.user!r} (and no usage under that id)")
        print(f"No usage recorded for user {args.user!r}{since}.")
        return 0
    print(f"Usage of user {args.user!r}{since}:")
    rows = [_row(f"{t.model} (batch)" if t.batch else t.model, [t], t.currency) for t in totals]
    for currency in sorted({t.currency for t in totals}):
        rows.append(_row("TOTAL", [t for t in totals if t.currency == currency], currency))
    header = ["MODEL", *(name for name, _ in _COLUMNS), "COST"]
    print(_table([header, *rows]))
    return 0


def _row(label: str, totals: list[ModelTotals], currency: str) -> list[str]:
    cost = sum(t.cost for t in totals)
    return [label, *(cell(totals) for _, cell in _COLUMNS), f"{cost:.6f} {currency}"]


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
    return "\n".join(lines)
