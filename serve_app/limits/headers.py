"""OpenAI's ``x-ratelimit-*`` response headers, from the buckets a request was admitted against.

OpenAI sends six headers on every answer, and client libraries pace themselves
on them::

    x-ratelimit-limit-requests      x-ratelimit-limit-tokens
    x-ratelimit-remaining-requests  x-ratelimit-remaining-tokens
    x-ratelimit-reset-requests      x-ratelimit-reset-tokens

A request here may be admitted against several buckets of one unit (the key's
RPM and the user's RPM; the key's TPM, the user's TPM and the user's daily
quota, all in tokens). The trio of a unit describes the *tightest* of them: the
one with the fewest remaining (ties: the one that takes longer to reset), since
that is the one the client runs into first. ``reset`` is the time until that
bucket is back to its full limit, written as OpenAI writes it (Go durations:
``"20ms"``, ``"1.5s"``, ``"6m0s"``, ``"23h59m59s"``). A unit no bucket limits
gets no headers: there is nothing to pace on.

The limiter records the states of one admission in a per-request report (a
context variable the ingress middleware opens per HTTP request); the middleware
writes the headers when the answer starts, so every route that admits through
the ``RateLimiter`` (chat, completions, responses, audio, documents, video) gets
them, streamed or not, and so does the 429 (it also carries them itself).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field

from serve_app.limits.buckets import BucketState

HEADER_PREFIX = "x-ratelimit-"


@dataclass
class RateLimitReport:
    """What the limiter decided for the current request (``states`` empty: no limit)."""

    states: tuple[BucketState, ...] = field(default_factory=tuple)


_current: ContextVar[RateLimitReport | None] = ContextVar("ratelimit_report", default=None)


def open_report() -> tuple[RateLimitReport, Token[RateLimitReport | None]]:
    """A fresh report for one HTTP request; pass the token to ``close_report``."""
    report = RateLimitReport()
    return report, _current.set(report)


def close_report(token: Token[RateLimitReport | None]) -> None:
    _current.reset(token)


def record_states(states: Sequence[BucketState]) -> None:
    """Called by the limiter on every decision; a no-op outside an HTTP request."""
    report = _current.get()
    if report is not None and states:
        report.states = tuple(states)


def format_reset(ms: int) -> str:
    """A Go duration string, as OpenAI writes ``x-ratelimit-reset-*``."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    out = f"{hours}h" if hours else ""
    if hours or minutes:
        out += f"{minutes}m"
    return f"{out}{seconds}s"


def _tightest(states: Iterable[BucketState]) -> BucketState | None:
    return min(states, key=lambda s: (s.remaining, -s.reset_ms), default=None)


def rate_limit_headers(states: Sequence[BucketState]) -> dict[str, str]:
    """The six headers (or three, or none) for one admission's bucket states."""
    headers: dict[str, str] = {}
    units = {
        "requests": (s for s in states if s.bucket.kind == "requests"),
        "tokens": (s for s in states if s.bucket.kind != "requests"),
    }
    for unit, candidates in units.items():
        state = _tightest(candidates)
        if state is None:
            continue
        headers[f"{HEADER_PREFIX}limit-{unit}"] = str(state.bucket.limit)
        headers[f"{HEADER_PREFIX}remaining-{unit}"] = str(state.remaining)
        headers[f"{HEADER_PREFIX}reset-{unit}"] = format_reset(state.reset_ms)
    return headers
