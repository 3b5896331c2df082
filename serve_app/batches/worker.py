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
remaining lines with the route's 401), inside ``running_batch_line``: the services
bill it at the batch discount under the line's deterministic ledger key and check
only the daily quota (``serve_app.billing.batch_line``).
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
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from serve_app.auth.principal import Principal
from serve_app.background import PeriodicLoop
from serve_app.batches.endpoints import ENDPOINTS, BatchServices, line_models
from serve_app.batches.records import (
    CANCELLED,
    COMPLETED,
    EXPIRED,
    LINE_DONE,
    LINE_FAILED,
    SUCCEEDED,
    VALIDATING,
    BatchRecord,
    ClaimedLine,
    LineResult,
    StoredLine,
    line_request_id,
    output_file_id,
)
from serve_app.batches.store import BatchStore
from serve_app.batches.validate import validate_input
from serve_app.billing.batch_line import BatchLine, running_batch_line
from serve_app.catalog.catalog import Catalog
from serve_app.config import BatchOptions
from serve_app.files.store import FileRecord, FileStore, object_key
from serve_app.inference.answers import Body
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
UNFINISHED_ERRORS = {
    EXPIRED: ("batch_expired", "This request could not be run before the batch expired."),
    CANCELLED: ("batch_cancelled", "This request was not run: the batch was cancelled."),
}


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
    ) -> None:
        self.store, self.files, self.objects = store, files, objects
        self.catalog, self.principals, self.services = catalog, principals, services
        self.metering, self.options = metering, options
        self.bill = bill
        self.clock = clock
        self.worker_id = worker_id or new_worker_id()
        self._tasks: set[asyncio.Task[None]] = set()
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
        await asyncio.to_thread(
            self.store.heartbeat, self.worker_id, self.clock(), self.options.lease_s
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
            self._tasks.add(task)
            task.add_done_callback(self._line_done)
        return bool(claimed)

    def _line_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._loop.wake()

    # ---- lines ---------------------------------------------------------------------------
    async def run_line(self, line: ClaimedLine) -> None:
        request_id = line_request_id(line.batch_id, line.custom_id)
        billing = BatchLine(request_id, line.batch_id, self.options.discount)
        if line.attempts > self.options.max_attempts:
            output = _line(request_id, line.custom_id, None, None)
            output["error"] = {
                "code": "attempts_exhausted",
                "message": f"The request was claimed {line.attempts - 1} times and its worker "
                "stopped each time; it was not run again.",
            }
            await self._complete(line, LineResult(LINE_FAILED, output), billing)
            return
        status_code, body, headers = await self._answer(line, billing)
        if status_code == 503:
            until = self.clock() + timedelta(seconds=DEFER_S)
            await asyncio.to_thread(self.store.defer_line, line, self.worker_id, until)
            return
        output = _line(request_id, line.custom_id, status_code, body, headers)
        status = SUCCEEDED if 200 <= status_code < 300 else LINE_FAILED
        await self._complete(line, LineResult(status, output), billing)

    async def _answer(
        self, line: ClaimedLine, billing: BatchLine
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """(status, body, headers worth keeping) of the line's request, run as live."""
        with running_batch_line(billing):
            try:
                principal = await self._principal(line.key_id)
                endpoint = ENDPOINTS[line.endpoint]
                answer = await endpoint.run(
                    self.services, endpoint.parse(json.loads(line.body)), principal
                )
                if not isinstance(answer, Body):  # a stream: refused by ``parse``
                    raise UpstreamError("The request did not produce a JSON answer.")
                kept = {
                    name.lower(): value
                    for name, value in answer.headers.items()
                    if name.lower().startswith("x-service-")
                }
                return answer.status_code, json.loads(answer.content), kept
            except GatewayError as err:
                return err.status_code, err.envelope(), {}
            except Exception:
                logger.exception("batch line %s:%d failed", line.batch_id, line.line)
                failure = GatewayError("The server had an internal error.", code="internal_error")
                return failure.status_code, failure.envelope(), {}

    async def _complete(self, line: ClaimedLine, result: LineResult, billing: BatchLine) -> None:
        records = billing.records if self.bill else []
        kept = await asyncio.to_thread(
            self.store.complete_line,
            line,
            self.worker_id,
            result,
            records,
            json.dumps(result.output, ensure_ascii=False),
            self.clock(),
        )
        if not kept:
            logger.info("batch line %s:%d was no longer ours", line.batch_id, line.line)

    async def _principal(self, key_id: str) -> Principal:
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
        try:
            if batch.status == VALIDATING:
                await self._validate(batch)
            else:
                await self._finalize(batch)
        finally:
            await asyncio.to_thread(self.store.release_stage, batch.id, self.worker_id)
        return True

    async def _validate(self, batch: BatchRecord) -> None:
        try:
            principal = await self._principal(batch.key_id)
        except AuthenticationError as err:
            await self._fail(batch, [BatchError(code="invalid_request", message=err.message)], 0)
            return
        source = await asyncio.to_thread(self.files.get, batch.input_file_id, batch.org_id)
        data = None
        if source is not None:
            with contextlib.suppress(NotFoundError):  # the row without its bytes: deleted
                data = await asyncio.to_thread(self.objects.get, source.object_key)
        if data is None:
            message = f"The input file '{batch.input_file_id}' was deleted before validation."
            await self._fail(batch, [BatchError(code="file_not_found", message=message)], 0)
            return
        models = line_models(self.services, self.catalog, batch.endpoint, principal)
        checked = await asyncio.to_thread(
            validate_input, data, batch.endpoint, models, self.options.max_lines
        )
        if checked.errors:
            await self._fail(batch, checked.errors, len(checked.lines))
            return
        limit = self.options.max_enqueued_tokens_per_org
        enqueued = await asyncio.to_thread(
            self.store.start,
            batch,
            self.worker_id,
            checked.lines,
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
            lines = await asyncio.to_thread(self.store.lines, batch.id)
            finalizing = all(line.status in LINE_DONE for line in lines)
            frozen = await asyncio.to_thread(
                self.store.freeze, batch.id, self.worker_id, self.clock(), finalizing
            )
            if not frozen:
                return
        # Read again: a cancel may have landed between the claim and the freeze.
        fresh = await asyncio.to_thread(self.store.get, batch.id, None)
        batch = fresh if fresh is not None else batch
        lines = await asyncio.to_thread(self.store.lines, batch.id)
        unfinished = [line for line in lines if line.status not in LINE_DONE]
        status = CANCELLED if batch.cancelling_at is not None else COMPLETED
        if status == COMPLETED and unfinished:
            status = EXPIRED
        outputs, errors = _assemble(batch, lines, status)
        now = self.clock()
        files = [
            self._file(batch, kind, content, now)
            for kind, content in (("output", outputs), ("error", errors))
        ]
        for record, content in zip(files, (outputs, errors), strict=True):
            if record is not None:
                await asyncio.to_thread(
                    self.objects.put, record.object_key, content, "application/jsonl"
                )
        completed = sum(1 for line in lines if line.status == SUCCEEDED)
        failed = sum(1 for line in lines if line.status == LINE_FAILED)
        if status == EXPIRED:
            failed += len(unfinished)
        await asyncio.to_thread(
            self.store.finish,
            batch.id,
            self.worker_id,
            status,
            (len(lines), completed, failed),
            files[0],
            files[1],
            now,
        )

    @staticmethod
    def _file(batch: BatchRecord, kind: str, content: bytes, now: datetime) -> FileRecord | None:
        if not content:
            return None
        file_id = output_file_id(batch.id, kind)
        return FileRecord(
            id=file_id,
            org_id=batch.org_id,
            user_id=batch.user_id,
            purpose="batch_output",
            filename=f"{batch.id}_{kind}.jsonl",
            bytes=len(content),
            object_key=object_key(file_id),
            created_at=now,
        )


def _line(
    request_id: str,
    custom_id: str,
    status_code: int | None,
    body: dict[str, Any] | None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An output line: OpenAI's ``{id, custom_id, response, error}``; ``response.headers``
    carries the gateway's ``x-service-*`` headers (ignored parameters) when there are any."""
    response: dict[str, Any] | None = None
    if status_code is not None:
        response = {"status_code": status_code, "request_id": request_id, "body": body}
        if headers:
            response["headers"] = headers
    return {"id": request_id, "custom_id": custom_id, "response": response, "error": None}


def _assemble(batch: BatchRecord, lines: list[StoredLine], status: str) -> tuple[bytes, bytes]:
    """The output file (succeeded lines) and error file (failed ones, and, when the
    batch expired or was cancelled, those never run), in input order."""
    outputs: list[str] = []
    errors: list[str] = []
    for line in lines:
        if line.status in LINE_DONE and line.result is not None:
            (outputs if line.status == SUCCEEDED else errors).append(line.result)
            continue
        code, message = UNFINISHED_ERRORS.get(status, UNFINISHED_ERRORS[EXPIRED])
        output = _line(line_request_id(batch.id, line.custom_id), line.custom_id, None, None)
        output["error"] = {"code": code, "message": message}
        errors.append(json.dumps(output, ensure_ascii=False))
    return (
        "".join(f"{text}\n" for text in outputs).encode(),
        "".join(f"{text}\n" for text in errors).encode(),
    )
