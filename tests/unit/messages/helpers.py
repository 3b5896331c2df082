"""Helpers for the Messages API tests: the anthropic SDK and raw HTTP on the in-process app."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2

from serve_app.billing.records import UsageRecord
from serve_app.billing.store import LedgerStore
from tests.fixtures.gateway import GatewayHarness


def sdk(harness: GatewayHarness, key: str, **options: Any) -> anthropic.AsyncAnthropic:
    """The anthropic SDK as a client of the in-process gateway (``x-api-key`` auth); the
    SDK is built on ``httpx2``, which has its own ASGI transport."""
    return anthropic.AsyncAnthropic(
        api_key=key,
        base_url="http://gateway.test",
        http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=harness.app)),
        max_retries=0,
        **options,
    )


def named_events(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """``(event name, payload)`` of each event of an Anthropic SSE body."""
    out = []
    for block in raw.split("\n\n"):
        lines = block.strip().splitlines()
        if not lines:
            continue
        name = lines[0].removeprefix("event: ")
        data = json.loads(lines[1].removeprefix("data: "))
        assert data["type"] == name
        out.append((name, data))
    return out


async def ledger_rows(harness: GatewayHarness, user: str = "alice") -> list[UsageRecord]:
    ledger = harness.metering.ledger
    assert ledger is not None
    assert await ledger.flush()
    found = harness.store.get_user(user)
    assert found is not None
    return list(LedgerStore(ledger.store._db).records_for(found.id))


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, **extra}


def request(model: str, text: str, max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "messages": [user(text)], **extra}
