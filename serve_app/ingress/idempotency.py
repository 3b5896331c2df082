"""``Idempotency-Key``: a retried request is answered once, generated once, billed once.

What identifies a retry. The official ``openai`` Python SDK retries
connection errors, timeouts, 408, 409, 429 and 5xx by itself, but it sends
no request identity with them: only ``x-stainless-retry-count`` (the attempt
number), which cannot tell a retry from a new request with the same text.
The one identity a client can give is the ``Idempotency-Key`` header (the
SDKs pass it with ``extra_headers``; other clients set it directly). So:

- Without the header, every HTTP request is its own request: it is billed
  for what it produced, once (the ledger stores one row per request id), and
  a request that produced nothing (a 429, an error before output) is not
  billed at all. Each generated token is billed exactly once.
- With it, on POST routes under ``/v1/``, the first attempt claims the key
  (scoped to the caller's organization and API key, and the route) and runs. The
  caller is authenticated before this middleware runs (``auth_first``): a revoked
  key gets its 401, never a stored answer. If it completes with a 2xx, its
  answer, streams included, is kept 24 h and every retry with the same key
  gets that answer back (``Idempotent-Replayed: true``): no new generation,
  no rate-limit use, no second ledger row. An attempt that fails or that the
  client leaves stores nothing, so the retry runs (the abandoned attempt is
  still billed for what it produced, once).
- A retry arriving while the first attempt runs waits for it and then gets
  its answer (or runs itself if the first failed). The same key with a
  different body is a 400 ``idempotency_key_reused``.

If the store is unreachable the request is served as if it had no key (logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import tempfile
import time
from typing import IO

from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.auth.dashboard import SESSION_COOKIE
from serve_app.ingress.errors import error_response
from serve_app.protocol.errors import ConflictError, GatewayError, InvalidRequestError
from serve_app.requests.deps import known_caller
from serve_app.requests.replays import Answered, Claimed, InFlight, ReplayStore, StoredAnswer

logger = logging.getLogger(__name__)

IDEMPOTENCY_HEADER = b"idempotency-key"
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")
"""Printable ASCII without spaces, 1-255 characters (a UUID is the usual choice)."""

KEEP_S = 86_400.0
LEASE_S = 60.0
WAIT_S = 600.0
POLL_S = 0.1
MAX_STORED_BYTES = 8 * 1024 * 1024
"""Answers larger than this (long speech) are not kept: their retries run again."""

_SPOOL_IN_MEMORY = 1024 * 1024
_CHUNK = 64 * 1024
_NOT_REPLAYED = frozenset({"date", "server", "transfer-encoding", "connection"})


class IdempotencyMiddleware:
    """Pure ASGI middleware; inner to the body limit (bodies are already bounded) and
    to ``AuthFirstMiddleware`` (the caller is known and allowed before anything is
    spooled or replayed)."""

    def __init__(
        self,
        app: ASGIApp,
        store: ReplayStore,
        *,
        path_prefix: str = "/v1/",
        keep_s: float = KEEP_S,
        lease_s: float = LEASE_S,
        wait_s: float = WAIT_S,
        poll_s: float = POLL_S,
        max_stored_bytes: int = MAX_STORED_BYTES,
    ) -> None:
        self.app = app
        self.store = store
        self.path_prefix = path_prefix
        self.keep_s = keep_s
        self.lease_s = lease_s
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.max_stored_bytes = max_stored_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = _idempotency_key(scope) if scope["type"] == "http" else None
        if (
            key is None
            or scope.get("method") != "POST"
            or not scope.get("path", "").startswith(self.path_prefix)
        ):
            await self.app(scope, receive, send)
            return
        if not KEY_PATTERN.match(key):
            err = InvalidRequestError(
                "Idempotency-Key must be 1 to 255 printable ASCII characters without spaces.",
                code="invalid_idempotency_key",
                param="Idempotency-Key",
            )
            await error_response(err, scope.get("path"))(scope, receive, send)
            return
        body = await _spool_body(receive)
        if body is None:
            return  # the client left while sending (or the body limit cut it off)
        with body:
            await self._handle(scope, receive, send, key, body)

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, key: str, body: IO[bytes]
    ) -> None:
        fingerprint = _fingerprint(scope, body)
        slot = _slot(scope, key)
        try:
            outcome = await self._claim(slot, fingerprint)
        except Exception:
            logger.warning("idempotency store unavailable; serving without it", exc_info=True)
            await self.app(scope, _body_receive(body, receive), send)
            return
        if isinstance(outcome, Claimed):
            await self._run(scope, receive, send, body, slot, outcome.token)
            return
        if outcome.fingerprint != fingerprint:
            await _refuse(_reused(), scope, receive, send)
        elif isinstance(outcome, Answered):
            await _replay(outcome.answer, send)
        else:
            err = ConflictError(
                "A request with this Idempotency-Key is still running; retry shortly.",
                code="idempotency_key_in_use",
                headers={"Retry-After": "1"},
            )
            await _refuse(err, scope, receive, send)

    async def _claim(self, slot: str, fingerprint: str) -> Claimed | InFlight | Answered:
        """Claim the slot, or wait while an attempt with the same body runs."""
        deadline = time.monotonic() + self.wait_s
        while True:
            outcome = await self.store.claim(slot, fingerprint, self.lease_s)
            if not isinstance(outcome, InFlight) or outcome.fingerprint != fingerprint:
                return outcome
            if time.monotonic() >= deadline:
                return outcome
            await asyncio.sleep(self.poll_s)

    async def _run(
        self, scope: Scope, receive: Receive, send: Send, body: IO[bytes], slot: str, token: str
    ) -> None:
        recorder = _Recorder(send, self.max_stored_bytes)
        renewing = asyncio.create_task(self._renew(slot, token))
        try:
            await self.app(scope, _body_receive(body, receive), recorder.send)
        finally:
            renewing.cancel()
            answer = recorder.answer()
            # Shielded: a cancelled request (client gone) must still free its claim.
            await asyncio.shield(self._settle(slot, token, answer))

    async def _renew(self, slot: str, token: str) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            with contextlib.suppress(Exception):
                await self.store.renew(slot, token, self.lease_s)

    async def _settle(self, slot: str, token: str, answer: StoredAnswer | None) -> None:
        try:
            if answer is None:
                await self.store.release(slot, token)
            else:
                await self.store.complete(slot, token, answer, self.keep_s)
        except Exception:
            logger.warning("idempotency slot not settled (its lease will expire)", exc_info=True)


class _Recorder:
    """Passes the answer through and keeps a copy of a complete 2xx one."""

    def __init__(self, send: Send, max_bytes: int) -> None:
        self._send = send
        self._max_bytes = max_bytes
        self._status = 0
        self._headers: list[tuple[str, str]] = []
        self._body = bytearray()
        self._too_big = False
        self._complete = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._status = int(message["status"])
            self._headers = [
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in message.get("headers", [])
                if name.decode("latin-1").lower() not in _NOT_REPLAYED
            ]
            await self._send(message)
            return
        await self._send(message)  # raises when the client is gone: nothing is kept
        if message["type"] != "http.response.body":
            return
        chunk = message.get("body", b"")
        if len(self._body) + len(chunk) > self._max_bytes:
            self._too_big = True
        elif not self._too_big:
            self._body.extend(chunk)
        if not message.get("more_body", False):
            self._complete = True

    def answer(self) -> StoredAnswer | None:
        """The answer to keep: whole, sent to its end, and a success."""
        if not self._complete or self._too_big or not 200 <= self._status < 300:
            return None
        return StoredAnswer(self._status, self._headers, bytes(self._body))


async def _replay(answer: StoredAnswer, send: Send) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers]
    headers.append((REPLAYED_HEADER.lower().encode(), b"true"))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})


async def _refuse(err: GatewayError, scope: Scope, receive: Receive, send: Send) -> None:
    await error_response(err, scope.get("path"))(scope, receive, send)


def _reused() -> InvalidRequestError:
    return InvalidRequestError(
        "This Idempotency-Key was used with a different request body; use a new key for a "
        "new request.",
        code="idempotency_key_reused",
        param="Idempotency-Key",
    )


def _idempotency_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == IDEMPOTENCY_HEADER:
            return str(value.decode("latin-1"))
    return None


def _header(scope: Scope, wanted: bytes) -> bytes:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return bytes(value)
    return b""


def _caller(scope: Scope) -> bytes:
    """Who asks: the whole Authorization value, else the dashboard session's cookie token
    (the auth dependency reads them in that order), else nothing (such a request is a 401
    and stores no answer)."""
    authorization = _header(scope, b"authorization")
    if authorization:
        return b"authorization:" + authorization
    token = cookie_parser(_header(scope, b"cookie").decode("latin-1")).get(SESSION_COOKIE)
    return b"session:" + token.encode() if token else b""


def _slot(scope: Scope, key: str) -> str:
    """One slot per caller, route and key.

    The caller is the one ``AuthFirstMiddleware`` authenticated before this runs: its
    organization and key id, so another organization's key (or a dashboard session,
    which sends no Authorization header) never shares a slot with it. A route without
    a caller dependency falls back to its credential (``_caller``).
    """
    caller = known_caller(scope)
    if caller is not None:
        who = b"caller\0" + f"{caller.org_id}\0{caller.key_id}".encode()
    else:
        who = b"header\0" + _caller(scope)
    digest = hashlib.sha256()
    for part in (who, scope["path"].encode(), key.encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def _fingerprint(scope: Scope, body: IO[bytes]) -> str:
    """A hash of the body; a multipart boundary (random per attempt) is left out."""
    boundary = _boundary(_header(scope, b"content-type"))
    digest = hashlib.sha256(scope.get("query_string", b""))
    body.seek(0)
    carry = b""
    while chunk := body.read(_CHUNK):
        data = carry + chunk
        if boundary:
            data = data.replace(boundary, b"")
            cut = max(0, len(data) - (len(boundary) - 1))  # a boundary across two chunks
            data, carry = data[:cut], data[cut:]
        digest.update(data)
    digest.update(carry.replace(boundary, b"") if boundary else carry)
    body.seek(0)
    return digest.hexdigest()


def _boundary(content_type: bytes) -> bytes:
    match = re.search(rb'boundary="?([^";,\s]+)"?', content_type, re.IGNORECASE)
    return match.group(1) if match and content_type.lower().startswith(b"multipart/") else b""


async def _spool_body(receive: Receive) -> IO[bytes] | None:
    """The whole body (on disk past 1 MiB: uploads reach 25 MB); None if the client left."""
    spooled: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # noqa: SIM115
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            spooled.close()
            return None
        spooled.write(message.get("body", b""))
        more = bool(message.get("more_body", False))
    spooled.seek(0)
    return spooled


def _body_receive(body: IO[bytes], receive: Receive) -> Receive:
    """The spooled body in chunks, then the live channel (to see a disconnect)."""
    body.seek(0)
    done = False

    async def replay() -> Message:
        nonlocal done
        if done:
            return await receive()
        chunk = body.read(_CHUNK)
        more = bool(chunk) and body.tell() < _size(body)
        done = not more
        return {"type": "http.request", "body": chunk, "more_body": more}

    return replay


def _size(body: IO[bytes]) -> int:
    here = body.tell()
    end = body.seek(0, 2)
    body.seek(here)
    return end
