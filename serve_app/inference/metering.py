"""Limits, usage records and metrics around one generation request.

The text service calls ``Metering.admit`` once the head has accepted the prompt
(``HeadStarted``: the prompt's token count and ``max_tokens`` per choice are
then known) and before any byte is sent, so a 429 is a real status and the
reservation is the most the request can use: prompt + choices x max_tokens.
Every head event then passes through ``MeteredRequest.observe`` and, however
the request ends (done, upstream broke, client left), ``finish`` runs once: it
bills what was produced, settles the reservation to the real token count and
reports metrics. A request that produced nothing is not billed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from serve_app.auth.principal import Principal
from serve_app.billing.batch_line import current_batch_line
from serve_app.billing.ledger import UsageLedger
from serve_app.billing.pricing import NO_TOOL_PRICES, ToolPrices, build_record
from serve_app.billing.records import UsageQuantities, UsageStatus
from serve_app.billing.store import LedgerStore
from serve_app.catalog.config import CatalogModel
from serve_app.config import GatewayAppArgs
from serve_app.contract.chat import GenerationDone, HeadEvent, HeadStarted, TextDelta
from serve_app.limits.buckets import CounterStore, Ticket
from serve_app.limits.limiter import PlatformLimits, RateLimiter, build_counter_store
from serve_app.metrics import GatewayMetrics, NoopBackend
from serve_app.protocol.errors import RateLimitError
from serve_app.settings import GatewaySettings, ProductionRefused
from serve_app.storage.db import Database

logger = logging.getLogger(__name__)


@dataclass
class RequestMeta:
    """Who asked for what; fixed before the head is called."""

    principal: Principal
    model: CatalogModel
    endpoint: str
    request_id: str
    n_choices: int
    started_at: float = field(default_factory=time.monotonic)


@dataclass
class UsageTracker:
    """Tokens seen so far: the final count when the head finished, else per choice."""

    prompt_tokens: int
    per_choice: dict[int, int] = field(default_factory=dict)
    done: GenerationDone | None = None
    web_searches: int = 0
    code_seconds: float = 0.0

    def observe(self, event: HeadEvent) -> None:
        if isinstance(event, TextDelta):
            seen = self.per_choice.get(event.choice_index, 0)
            self.per_choice[event.choice_index] = max(seen, event.completion_tokens)
        elif isinstance(event, GenerationDone):
            self.done = event

    def quantities(self, requests: int) -> UsageQuantities:
        done = self.done
        if done is not None:
            return UsageQuantities(
                prompt_tokens=done.prompt_tokens,
                completion_tokens=done.completion_tokens,
                cached_tokens=done.cached_tokens,
                reasoning_tokens=done.reasoning_tokens,
                requests=requests,
                web_searches=self.web_searches,
                code_seconds=self.code_seconds,
            )
        return UsageQuantities(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=sum(self.per_choice.values()),
            requests=requests,
            web_searches=self.web_searches,
            code_seconds=self.code_seconds,
        )

    def produced(self) -> bool:
        return self.done is not None or any(self.per_choice.values())


class Metering:
    """The per-replica limiter, ledger and metrics, as the request path uses them."""

    def __init__(
        self,
        limiter: RateLimiter | None = None,
        ledger: UsageLedger | None = None,
        metrics: GatewayMetrics | None = None,
        tool_prices: ToolPrices = NO_TOOL_PRICES,
    ) -> None:
        self.limiter = limiter
        self.ledger = ledger
        self.metrics = metrics or GatewayMetrics()
        self.tool_prices = tool_prices
        self.live_in_flight = 0
        """Admitted live (not batch) requests of this replica not finished yet: batch
        workers start no new line while it is above zero (``serve_app.batches.worker``)."""
        self.live_ended_at = float("-inf")
        """``time.monotonic()`` when the last live request finished (the workers' quiet
        period runs from it)."""

    async def admit(self, meta: RequestMeta, started: HeadStarted) -> MeteredRequest:
        """Reserve capacity for the request or raise the 429 (the caller closes the head)."""
        cost = started.prompt_tokens + meta.n_choices * started.max_tokens
        ticket = None
        if self.limiter is not None:
            try:
                ticket = await self.limiter.admit(meta.principal, meta.request_id, cost)
            except RateLimitError as err:
                self.metrics.rate_limited(meta.model.id, err.code or "rate_limit_exceeded")
                self.metrics.request(meta.model.id, meta.endpoint, "rejected")
                raise
        live = current_batch_line() is None
        if live:
            self.live_in_flight += 1
        return MeteredRequest(self, meta, UsageTracker(started.prompt_tokens), ticket, live=live)

    def failed(self, meta: RequestMeta) -> None:
        """A request the head refused or failed before admission (not billed, nothing
        reserved); its latency is reported like any other answer's."""
        self.metrics.request(meta.model.id, meta.endpoint, "error")
        self.metrics.latency(meta.model.id, meta.endpoint, time.monotonic() - meta.started_at)

    def record(self, meta: RequestMeta, status: UsageStatus, quantities: UsageQuantities) -> None:
        """Price ``quantities`` for ``meta``'s caller and model and spool the ledger row.

        Never raises: a request already answered must not fail on billing; a
        record that could not be spooled is logged with its request id. A batch
        line's record is priced at its discount under its own ledger key and handed
        to the line (``serve_app.billing.batch_line``), not spooled.
        """
        line = current_batch_line()
        if self.ledger is None and line is None:
            return
        record = build_record(
            request_id=meta.request_id if line is None else line.record_id(),
            created_at=datetime.now(UTC),
            user_id=meta.principal.user_id,
            key_id=meta.principal.key_id,
            org_id=meta.principal.org_id,
            model=meta.model.id,
            route=meta.endpoint,
            status=status,
            usage=quantities,
            pricing=meta.model.pricing,
            tool_prices=self.tool_prices,
            batch_id=None if line is None else line.batch_id,
            batch_discount=None if line is None else line.discount,
        )
        if line is not None:
            line.records.append(record)
            return
        assert self.ledger is not None
        try:
            self.ledger.submit(record)
        except Exception:
            logger.exception("usage record %s not spooled", meta.request_id)

    async def start(self) -> None:
        if self.ledger is not None:
            await self.ledger.start()

    async def aclose(self) -> None:
        if self.ledger is not None:
            await self.ledger.aclose()
        if self.limiter is not None:
            await self.limiter.aclose()


class MeteredRequest:
    """One admitted request; ``finish`` is idempotent."""

    def __init__(
        self,
        metering: Metering,
        meta: RequestMeta,
        usage: UsageTracker,
        ticket: Ticket | None,
        *,
        live: bool = False,
    ) -> None:
        self._metering = metering
        self._live = live
        self.meta = meta
        self.usage = usage
        self.ticket = ticket
        self.finished = False

    def observe(self, event: HeadEvent) -> None:
        self.usage.observe(event)

    def observe_first(self, event: HeadEvent) -> None:
        """The first output, read before the answer starts: counted at once, so a
        client who leaves before it is relayed still pays for what was generated.

        Only a delta: a first turn's ``GenerationDone`` is not the request's end when
        the server-tool loop goes on (the loop reports its own totals).
        """
        if isinstance(event, TextDelta):
            self.usage.observe(event)

    def add_turn(self, prompt_tokens: int) -> None:
        """A further model turn of the server-tool loop: its prompt is billed as well."""
        self.usage.prompt_tokens += prompt_tokens

    def add_tool_use(self, *, web_searches: int = 0, code_seconds: float = 0.0) -> None:
        """Executed searches and billed sandbox seconds (docs/reference/chat.md#server-tools)."""
        self.usage.web_searches += web_searches
        self.usage.code_seconds += code_seconds

    def status(self, aborted: bool) -> UsageStatus:
        if self.usage.done is not None:
            return "ok"
        return "aborted" if aborted else "partial"

    async def finish(self, *, aborted: bool) -> None:
        """Bill, report and settle; ``aborted`` means the client went away."""
        if self.finished:
            return
        self.finished = True
        meta, metering = self.meta, self._metering
        if self._live:
            metering.live_in_flight -= 1
            metering.live_ended_at = time.monotonic()
        status = self.status(aborted)
        billed = self.usage.produced()
        quantities = self.usage.quantities(meta.n_choices)
        if billed:
            self._submit(status, quantities)
            metering.metrics.tokens(
                meta.model.id, quantities.prompt_tokens, quantities.completion_tokens
            )
        # Nothing produced (the head failed, or the client left, before the first token):
        # not billed, and counted as an error or an abort, never as a partial answer.
        outcome = status if billed else ("aborted" if aborted else "error")
        metering.metrics.request(meta.model.id, meta.endpoint, outcome)
        metering.metrics.latency(meta.model.id, meta.endpoint, time.monotonic() - meta.started_at)
        if metering.limiter is not None:
            used = quantities.prompt_tokens + quantities.completion_tokens if billed else 0
            await metering.limiter.settle(self.ticket, used)

    def _submit(self, status: UsageStatus, quantities: UsageQuantities) -> None:
        self._metering.record(self.meta, status, quantities)


def require_recording(metrics: GatewayMetrics) -> None:
    """Production: the no-op backend (the last fallback, when neither Ray Serve's metrics
    nor prometheus_client can be had) is a start-up error, not a gateway serving blind."""
    if isinstance(metrics.backend, NoopBackend):
        raise ProductionRefused(
            "deployment_mode is production but no metrics backend is available (neither Ray "
            "Serve's metrics nor prometheus_client): install prometheus_client "
            "(docs/deployment.md, 'Refusals')"
        )


def build_metering(
    config: GatewayAppArgs,
    database: Database,
    settings: GatewaySettings,
    *,
    counters: CounterStore | None = None,
    metrics: GatewayMetrics | None = None,
) -> Metering:
    """Limiter (Redis when ``settings.redis_url``), ledger and metrics of one replica."""
    limits = config.limits
    platform = PlatformLimits(
        rpm=limits.rpm, tpm=limits.tpm, daily_tokens=limits.daily_tokens, window_s=limits.window_s
    )
    if counters is None and not settings.redis_url and config.ingress.num_replicas > 1:
        logger.warning(
            "%d gateway replicas without GATEWAY_REDIS_URL: each replica keeps its own rate "
            "limit counters (a limit of N admits up to %d x N) and its own Idempotency-Key "
            "answers; set GATEWAY_REDIS_URL to share them",
            config.ingress.num_replicas,
            config.ingress.num_replicas,
        )
    store = counters or build_counter_store(
        settings.redis_url, window_s=limits.window_s, prefix=limits.redis_prefix
    )
    # The ledger rebuilds a lost daily quota counter (only when there is a ledger to read).
    daily_usage = LedgerStore(database).tokens_between if config.ledger.enabled else None
    metrics = metrics or GatewayMetrics()
    if config.deployment_mode == "production":
        require_recording(metrics)
    limiter = RateLimiter(
        store,
        platform,
        fail_open=limits.fail_open,
        daily_usage=daily_usage,
        on_fail_open=metrics.limits_fail_open,
    )
    ledger = None
    if config.ledger.enabled:
        spool = (
            Path(config.ledger.spool_dir)
            if config.ledger.spool_dir
            else settings.state_dir / "ledger-spool"
        )
        ledger = UsageLedger(
            LedgerStore(database),
            spool,
            flush_interval_s=config.ledger.flush_interval_s,
            batch_size=config.ledger.batch_size,
            fsync=config.ledger.fsync,
        )
    tool_prices = ToolPrices(
        per_search=config.tools.web_search.price_per_search,
        per_code_second=config.tools.code_interpreter.price_per_second,
    )
    return Metering(limiter, ledger, metrics, tool_prices)
