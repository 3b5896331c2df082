"""The batch worker: a background loop of each gateway replica that validates batches,
runs their lines through the live services, and finalizes them.

Work is claimed from the database under leases (``serve_app.batches.store``), so any
replica's worker can take any batch, and a killed worker's lines are claimed again
once their lease passes (``batches.lease_s``); a finished line's result is stored
with its usage record in one transaction, so none runs twice into the output and
none is billed twice or lost. The output and error files are assembled from the
stored results when the batch is finalized.

It runs on idle capacity: at most ``batches.concurrency`` lines at once, and, with
``batches.yield_to_live``, no new line starts while a live request of this replica
is in flight (``Metering.live_in_flight``), nor within ``batches.live_quiet_s`` after
one ended (a client's next call often follows at once). Lines already running finish.

Each line runs under its batch owner's key as it is now (a revoked key fails the
remaining lines with the route's 401: the owners are cached ``PRINCIPAL_TTL_S``, and
the cache is dropped whenever the accounts generation moves, as the key cache of
``AuthService`` is, so a revocation stops the next line at once), inside
``running_batch_line``: the services bill it at the batch discount under the line's
deterministic ledger key and check only the daily quota (``serve_app.billing.batch_line``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from serve_app.auth.principal import Principal
from serve_app.background import PeriodicLoop
from serve_app.batches.endpoints import ENDPOINTS, BatchServices, line_models
from serve_app.batches.finalize import answer_line, error_line, write_files
from serve_app.batches.records import (
    CANCELLED,
    COMPLETED,
    EXPIRED,
    LINE_FAILED,
    SUCCEEDED,
    VALIDATING,
    BatchRecord,
    ClaimedLine,
    LineResult,
    line_request_id,
)
from serve_app.batches.store import BatchStore
from serve_app.batches.validate import Validated, validate_input
from serve_app.billing.batch_line import BatchLine, running_batch_line
from serve_app.catalog.catalog import Catalog
from serve_app.config import BatchOptions
from serve_app.files.store import FileStore
from serve_app.inference.answers import JSON, Body
from serve_app.inference.metering import Metering
from serve_app.protocol.batches import BatchError
from serve_app.protocol.errors import (
    AuthenticationError,
    GatewayError,
    NotFoundError,
    UpstreamError,
)
from serve_app.storage.objects import ObjectStore
from serve_app.storage.schema import utcnow

logger = logging.getLogger(__name__)

DEFER_S = 5.0
"""How long a line waits after its model answered 503 (warming, overloaded)."""
LIVE_POLL_S = 0.05
"""How often a worker yielding to live traffic looks again."""
PRINCIPAL_TTL_S = 10.0
RESULT_TOO_LARGE = "result_too_large"
"""A line whose answer passed ``batches.max_line_result_bytes``: failed, not billed."""


class _ResultTooLarge(Exception):
    def __init__(self, size: int, cap: int) -> None:
        super().__init__(size)
        self.message = (
            f"The answer to this request was {size} bytes; a batch line's answer may be at "
            f"most {cap} bytes (batches.max_line_result_bytes). It was not kept or billed: "
            "split the request (fewer inputs, a smaller max_tokens) and send it again."
        )


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class BatchWorker:
    """One replica's worker; ``start``/``stop`` on the replica's loop, ``drain`` in tests."""

    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        objects: ObjectStore,
        catalog: Catalog,
        principals: Callable[[str], Principal | None],
        services: BatchServices,
        metering: Metering,
        options: BatchOptions,
        *,
        bill: bool = True,
        clock: Callable[[], datetime] = utcnow,
        worker_id: str | None = None,
        accounts_generation: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self.store, self.files, self.objects = store, files, objects
        self.catalog, self.principals, self.services = catalog, principals, services
        self.metering, self.options = metering, options
        self.bill = bill
        self.clock = clock
        self.worker_id = worker_id or new_worker_id()
        self._tasks: dict[asyncio.Task[None], ClaimedLine] = {}
        """The lines this worker runs: the heartbeat renews their leases and no others."""
        self._stage: str | None = None
        """The batch whose stage (validation, finalization) this worker is running now."""
        self._worked = False
        self._loop = PeriodicLoop(
            self._round, self._pause, logger=logger, failure="batch worker step failed"
        )
        self._beats = PeriodicLoop(
            self._heartbeat,
            self.options.lease_s / 3,
            logger=logger,
            failure="batch lease heartbeat failed",
            wait_first=True,
        )
        self._owners: dict[str, tuple[float, Principal | None]] = {}
        self._accounts_generation = accounts_generation
        self._owners_generation: int | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()
        self._beats.start()

    def wake(self) -> None:
        self._loop.wake()

    async def stop(self) -> None:
        """Stop claiming, abandon running lines and put them back for another worker."""
        for task in self._tasks:
            task.cancel()
        await self._loop.stop()
        await self._beats.stop()
        for task in tuple(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.to_thread(self.store.release_lines, self.worker_id)

    async def _round(self) -> None:
        self._worked = False
        self._worked = await self.step()

    def _pause(self) -> float:
        """No wait after a round that worked; a shorter poll while live traffic runs."""
        if self._worked:
            return 0.0
        wait = self.options.poll_interval_s
        return min(wait, LIVE_POLL_S) if self._yielding() else wait

    async def _heartbeat(self) -> None:
        """Renew what this worker is working on, not whatever the database says it holds:
        a line whose completion, or a stage whose release, failed (the database was down)
        keeps this worker's name, and renewing it would keep it from every worker for good;
        left alone, its lease lapses and another claim runs it again."""
        lines = [(line.batch_id, line.line) for line in self._tasks.values()]
        await asyncio.to_thread(
            self.store.heartbeat,
            self.worker_id,
            self.clock(),
            self.options.lease_s,
            lines,
            self._stage,
        )

    # ---- one round -----------------------------------------------------------------------
    async def step(self) -> bool:
        """Run one due batch stage and start lines for the free slots; whether either."""
        if not self._tasks and not await asyncio.to_thread(self.store.has_work):
            return False
        staged = await self.run_stage()
        started = await self._fill()
        return staged or started

    async def drain(self) -> None:
        """Work until nothing is due and no line runs (tests, and nothing else)."""
        while True:
            worked = await self.step()
            if self._tasks:
                await asyncio.wait(set(self._tasks))
            elif not worked:
                return

    async def drain_running(self) -> None:
        """Wait for the lines already started (tests)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    def _yielding(self) -> bool:
        """Whether live traffic has the replica: a request in flight, or one that ended
        less than ``live_quiet_s`` ago."""
        if not self.options.yield_to_live:
            return False
        metering = self.metering
        quiet = time.monotonic() - metering.live_ended_at < self.options.live_quiet_s
        return metering.live_in_flight > 0 or quiet

    async def _fill(self) -> bool:
        free = self.options.concurrency - len(self._tasks)
        if free <= 0 or self._yielding():
            return False
        claimed = await asyncio.to_thread(
            self.store.claim_lines, self.worker_id, free, self.clock(), self.options.lease_s
        )
        for line in claimed:
            task = asyncio.get_running_loop().create_task(self.run_line(line))
            self._tasks[task] = line
            task.add_done_callback(self._line_done)
        return bool(claimed)

    def _line_done(self, task: asyncio.Task[None]) -> None:
        line = self._tasks.pop(task, None)
        if line is not None and not task.cancelled() and task.exception() is not None:
            logger.warning(
                "batch line %s:%d not completed (%s); its lease lapses and it runs again",
                line.batch_id,
                line.line,
                task.exception(),
            )
        self._loop.wake()

    # ---- lines ---------------------------------------------------------------------------
    async def run_line(self, line: ClaimedLine) -> None:
        request_id = line_request_id(line.batch_id, line.custom_id)
        billing = BatchLine(request_id, line.batch_id, self.options.discount)
        if line.attempts > self.options.max_attempts:
            message = (
                f"The request was claimed {line.attempts - 1} times and its worker "
                "stopped each time; it was not run again."
            )
            output = error_line(request_id, line.custom_id, "attempts_exhausted", message)
            await self._complete(line, LineResult(LINE_FAILED, output), billing)
            return
        try:
            status_code, body, headers = await self._answer(line, billing)
        except _ResultTooLarge as err:
            output = error_line(request_id, line.custom_id, RESULT_TOO_LARGE, err.message)
            await self._complete(line, LineResult(LINE_FAILED, output), billing, bill=False)
            return
        if status_code == 503:
            until = self.clock() + timedelta(seconds=DEFER_S)
            await asyncio.to_thread(self.store.defer_line, line, self.worker_id, until)
            return
        output = answer_line(request_id, line.custom_id, status_code, body, headers)
        status = SUCCEEDED if 200 <= status_code < 300 else LINE_FAILED
        await self._complete(line, LineResult(status, output), billing)

    async def _answer(
        self, line: ClaimedLine, billing: BatchLine
    ) -> tuple[int, str, dict[str, str]]:
        """(status, body as JSON text, headers worth keeping) of the line's request, run
        as live; ``_ResultTooLarge`` when its answer is over the line cap."""
        with running_batch_line(billing):
            try:
                principal = await self._principal(line.key_id)
                endpoint = ENDPOINTS[line.endpoint]
                answer = await endpoint.run(
                    self.services, endpoint.parse(json.loads(line.body)), principal
                )
                if not isinstance(answer, Body) or not answer.media_type.startswith(JSON):
                    raise UpstreamError("The request did not produce a JSON answer.")
                kept = {
                    name.lower(): value
                    for name, value in answer.headers.items()
                    if name.lower().startswith("x-service-")
                }
                return answer.status_code, self._body_text(answer.content), kept
            except _ResultTooLarge:
                raise
            except GatewayError as err:
                return err.status_code, json.dumps(err.envelope(), ensure_ascii=False), {}
            except Exception:
                logger.exception("batch line %s:%d failed", line.batch_id, line.line)
                failure = GatewayError("The server had an internal error.", code="internal_error")
                return failure.status_code, json.dumps(failure.envelope()), {}

    def _body_text(self, content: bytes) -> str:
        """The answer's JSON as one line of text, refused over the cap before anything
        else is made of it. Answers are compact JSON; one holding a line break (only
        whitespace can be one in JSON) is rewritten compact."""
        cap = self.options.max_line_result_bytes
        if len(content) > cap:
            raise _ResultTooLarge(len(content), cap)
        if b"\n" in content or b"\r" in content:
            return json.dumps(json.loads(content), ensure_ascii=False)
        return content.decode("utf-8")

    async def _complete(
        self, line: ClaimedLine, result: LineResult, billing: BatchLine, *, bill: bool = True
    ) -> None:
        records = billing.records if self.bill and bill else []
        kept = await asyncio.to_thread(
            self.store.complete_line,
            line,
            self.worker_id,
            result,
            records,
            result.output,
            self.clock(),
        )
        if not kept:
            logger.info("batch line %s:%d was no longer ours", line.batch_id, line.line)

    async def _principal(self, key_id: str) -> Principal:
        if self._accounts_generation is not None:
            generation = await self._accounts_generation()
            if generation != self._owners_generation:
                self._owners.clear()
                self._owners_generation = generation
        now = time.monotonic()
        cached = self._owners.get(key_id)
        if cached is None or now - cached[0] > PRINCIPAL_TTL_S:
            cached = (now, await asyncio.to_thread(self.principals, key_id))
            self._owners[key_id] = cached
        if cached[1] is None:
            raise AuthenticationError(
                "The API key that created this batch was revoked or no longer belongs to "
                "its organization."
            )
        return cached[1]

    # ---- batch stages --------------------------------------------------------------------
    async def run_stage(self) -> bool:
        batch = await asyncio.to_thread(
            self.store.claim_stage, self.worker_id, self.clock(), self.options.lease_s
        )
        if batch is None:
            return False
        self._stage = batch.id
        try:
            if batch.status == VALIDATING:
                await self._validate(batch)
            else:
                await self._finalize(batch)
        finally:
            self._stage = None
            await asyncio.to_thread(self.store.release_stage, batch.id, self.worker_id)
        return True

    async def _validate(self, batch: BatchRecord) -> None:
        try:
            principal = await self._principal(batch.key_id)
        except AuthenticationError as err:
            await self._fail(batch, [BatchError(code="invalid_request", message=err.message)], 0)
            return
        source = await asyncio.to_thread(self.files.get, batch.input_file_id, batch.org_id)
        chunks = None
        if source is not None:
            with contextlib.suppress(NotFoundError):  # the row without its bytes: deleted
                chunks = await asyncio.to_thread(self.objects.iter_chunks, source.object_key)
        if chunks is None:
            message = f"The input file '{batch.input_file_id}' was deleted before validation."
            await self._fail(batch, [BatchError(code="file_not_found", message=message)], 0)
            return
        models = line_models(self.services, self.catalog, batch.endpoint, principal)
        try:
            checked = await asyncio.to_thread(
                validate_input, chunks, batch.endpoint, models, self.options.max_lines
            )
        finally:
            await asyncio.to_thread(chunks.close)
        try:
            await self._start(batch, checked)
        finally:
            await asyncio.to_thread(checked.close)

    async def _start(self, batch: BatchRecord, checked: Validated) -> None:
        """Run the validated lines, or fail the batch: its errors, or the token limit."""
        if checked.errors:
            await self._fail(batch, checked.errors, checked.count)
            return
        limit = self.options.max_enqueued_tokens_per_org
        enqueued = await asyncio.to_thread(
            self.store.start,
            batch,
            self.worker_id,
            (checked.rows(), checked.count),
            checked.estimated_tokens,
            limit,
            self.clock(),
        )
        if enqueued is not None:
            message = (
                f"Enqueued token limit reached for this organization: {enqueued} tokens of "
                f"unfinished batches plus about {checked.estimated_tokens} for this one exceed "
                f"the limit of {limit}. Retry once other batches have finished."
            )
            await self._fail(batch, [BatchError(code="token_limit_exceeded", message=message)], 0)

    async def _fail(self, batch: BatchRecord, errors: list[BatchError], total: int) -> None:
        payload = json.dumps([e.model_dump() for e in errors])
        await asyncio.to_thread(
            self.store.fail, batch.id, self.worker_id, payload, total, self.clock()
        )

    async def _finalize(self, batch: BatchRecord) -> None:
        if batch.finalizing_at is None:
            tally = await asyncio.to_thread(self.store.line_tally, batch.id)
            frozen = await asyncio.to_thread(
                self.store.freeze, batch.id, self.worker_id, self.clock(), tally.open == 0
            )
            if not frozen:
                return
        # Read again: a cancel may have landed between the claim and the freeze.
        fresh = await asyncio.to_thread(self.store.get, batch.id, None)
        batch = fresh if fresh is not None else batch
        tally = await asyncio.to_thread(self.store.line_tally, batch.id)
        status = CANCELLED if batch.cancelling_at is not None else COMPLETED
        if status == COMPLETED and tally.open:
            status = EXPIRED
        now = self.clock()
        output, errors = await asyncio.to_thread(
            write_files, self.store, self.objects, batch, status, now
        )
        failed = tally.failed + (tally.open if status == EXPIRED else 0)
        await asyncio.to_thread(
            self.store.finish,
            batch.id,
            self.worker_id,
            status,
            (tally.total, tally.succeeded, failed),
            output,
            errors,
            now,
        )
