"""Light, steady chat load on an in-process gateway, and what each client saw.

Fault tests run this while they break a service underneath the gateway, then
compare what the clients were told (status, error code, the usage each answer
reported) with what the gateway did (the ledger, the limits).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import sqlalchemy as sa

from serve_app.storage.db import Database
from serve_app.storage.schema import usage_records
from tests.fixtures.gateway import GatewayHarness

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


@dataclass
class Answer:
    """One request as its client saw it (times are ``time.monotonic``)."""

    started: float
    ended: float
    status: int
    stream: bool
    request_id: str | None = None
    usage: tuple[int, int] | None = None
    """(prompt_tokens, completion_tokens) the answer reported."""
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    """An exception the client got instead of an HTTP answer (must never happen)."""

    @property
    def limited(self) -> bool:
        """Whether the answer carried rate-limit state (the counters were consulted)."""
        return "x-ratelimit-limit-requests" in self.headers


def chat_body(rng: random.Random, *, stream: bool) -> dict[str, Any]:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
    body: dict[str, Any] = {
        "model": "scripted-chat",
        "messages": [{"role": "user", "content": words}],
        "max_tokens": 8,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _usage(data: dict[str, Any]) -> tuple[int, int] | None:
    usage = data.get("usage")
    if not usage:
        return None
    return int(usage["prompt_tokens"]), int(usage["completion_tokens"])


async def send_chat(
    http: httpx.AsyncClient,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> Answer:
    """POST one chat completion, streamed or not, and read it to the end."""
    started = time.monotonic()
    stream = bool(body.get("stream"))
    try:
        async with http.stream(
            "POST", "/v1/chat/completions", json=body, headers=headers or {}
        ) as response:
            raw = await response.aread()
    except Exception as exc:  # an exception instead of an answer is the failure we look for
        return Answer(started, time.monotonic(), -1, stream, error=repr(exc))
    answer = Answer(started, time.monotonic(), response.status_code, stream)
    answer.headers = {k.lower(): v for k, v in response.headers.items()}
    if response.status_code != 200:
        answer.code = json.loads(raw).get("error", {}).get("code")
    elif not stream:
        data = json.loads(raw)
        answer.request_id, answer.usage = data["id"], _usage(data)
    else:
        _read_stream(raw.decode(), answer)
    return answer


def _read_stream(text: str, answer: Answer) -> None:
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        data = json.loads(line[len("data: ") :])
        if "error" in data:
            answer.code = data["error"].get("code") or "stream_error"
            continue
        answer.request_id = data.get("id", answer.request_id)
        answer.usage = _usage(data) or answer.usage


class ChatLoad:
    """``workers`` clients sending chats back to back (every other one streamed)."""

    def __init__(
        self, harness: GatewayHarness, key: str, *, workers: int = 4, pause_s: float = 0.01
    ) -> None:
        self.harness = harness
        self.key = key
        self.workers = workers
        self.pause_s = pause_s
        self.answers: list[Answer] = []
        self._running = True
        self._tasks: list[asyncio.Task[None]] = []

    async def _worker(self, seed: int) -> None:
        rng = random.Random(seed)
        async with self.harness.client(self.key) as http:
            n = 0
            while self._running:
                n += 1
                self.answers.append(await send_chat(http, chat_body(rng, stream=n % 2 == 0)))
                await asyncio.sleep(self.pause_s)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(self.workers)]

    async def stop(self) -> list[Answer]:
        self._running = False
        await asyncio.gather(*self._tasks)
        return self.answers


def client_usage(answers: list[Answer]) -> dict[str, tuple[int, int]]:
    """Usage per request id of every answer that reported some; an Idempotency-Key
    replay repeats its original's id and usage (it is billed once)."""
    seen: dict[str, tuple[int, int]] = {}
    for answer in answers:
        if answer.request_id is None or answer.usage is None:
            continue
        if answer.request_id in seen:
            assert answer.headers.get("idempotent-replayed") == "true", answer.request_id
            assert seen[answer.request_id] == answer.usage
        seen[answer.request_id] = answer.usage
    return seen


def ledger_usage(database: Database) -> dict[str, tuple[int, int]]:
    """Usage per request id as the ledger stored it."""
    c = usage_records.c
    query = sa.select(c.request_id, c.prompt_tokens, c.completion_tokens)
    with database.connect() as conn:
        return {row[0]: (int(row[1]), int(row[2])) for row in conn.execute(query)}


def answered(load: ChatLoad, since: float) -> int:
    """How many of the load's requests sent at ``since`` or later have their answer: what
    a fault test waits for instead of a fixed time (``tests.fixtures.waiting.until``)."""
    return sum(1 for a in load.answers if a.started >= since)


def during(answers: list[Answer], start: float, end: float) -> list[Answer]:
    """Answers to requests sent in [start, end)."""
    return [a for a in answers if start <= a.started < end]
