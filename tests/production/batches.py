"""Batches on the production stack: submit, watch the claims in PostgreSQL, and check
the end state against the database (lines, ledger) and the output file."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.production.stack import EMBED, ProductionStack, wait_for

LINES = 200
BATCH_TIMEOUT_S = 240.0
TERMINAL = ("completed", "failed", "expired", "cancelled")


def embedding_lines(count: int = LINES, tag: str = "line", inputs: int = 1) -> bytes:
    """``count`` cheap lines (``inputs`` short embeddings each, distinct inputs; each
    input's float embedding is ~4.6 kB of the output file)."""

    def line_input(i: int) -> str | list[str]:
        text = f"batch line number {i} of the {tag} run"
        return text if inputs == 1 else [f"{text}, input {j}" for j in range(inputs)]

    lines = [
        {
            "custom_id": f"{tag}-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": EMBED, "input": line_input(i)},
        }
        for i in range(count)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def submit(stack: ProductionStack, key: str, jsonl: bytes) -> str:
    with stack.http(key) as http:
        up = http.post(
            "/v1/files",
            files={"file": ("batch.jsonl", jsonl, "application/jsonl")},
            data={"purpose": "batch"},
        )
        assert up.status_code == 200, up.text
        made = http.post(
            "/v1/batches",
            json={
                "input_file_id": up.json()["id"],
                "endpoint": "/v1/embeddings",
                "completion_window": "24h",
            },
        )
        assert made.status_code == 200, made.text
        batch_id: str = made.json()["id"]
        return batch_id


def get_batch(stack: ProductionStack, key: str, batch_id: str) -> dict[str, Any]:
    with stack.http(key) as http:
        resp = http.get(f"/v1/batches/{batch_id}")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def wait_terminal(stack: ProductionStack, key: str, batch_id: str) -> dict[str, Any]:
    """Polls through the proxy; a poll that met a replica just killed (the proxy's own 5xx,
    or a cut connection) is asked again, as a client would."""

    def done() -> dict[str, Any] | None:
        try:
            with stack.http(key) as http:
                resp = http.get(f"/v1/batches/{batch_id}")
        except httpx.HTTPError:
            return None
        if resp.status_code >= 500:
            return None
        assert resp.status_code == 200, resp.text
        batch: dict[str, Any] = resp.json()
        return batch if batch["status"] in TERMINAL else None

    result: dict[str, Any] = wait_for(f"batch {batch_id} to end", done, BATCH_TIMEOUT_S, 0.5)
    return result


def output_lines(stack: ProductionStack, key: str, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    with stack.http(key) as http:
        resp = http.get(f"/v1/files/{file_id}/content")
    assert resp.status_code == 200, resp.text
    return [json.loads(line) for line in resp.text.split("\n") if line]


@dataclass
class ClaimWatch:
    """Samples ``batch_lines`` every 50 ms while a batch runs: which workers held running
    lines in the same snapshot (the claims are concurrent, not one after the other)."""

    stack: ProductionStack
    batch_id: str
    owners: Counter[str] = field(default_factory=Counter)
    """Snapshots in which each worker held at least one running line."""
    together: int = 0
    """Snapshots in which two or more workers held running lines at once."""
    done_lines: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> ClaimWatch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            rows = self.stack.rows(
                "SELECT lease_owner, status FROM batch_lines WHERE batch_id = :b",
                b=self.batch_id,
            )
            running = {r.lease_owner for r in rows if r.status == "running" and r.lease_owner}
            self.owners.update(running)
            self.together += len(running) >= 2
            self.done_lines = sum(r.status in ("succeeded", "failed") for r in rows)

    def running_owner(self) -> str | None:
        """A worker holding a running line right now."""
        rows = self.stack.rows(
            "SELECT lease_owner FROM batch_lines WHERE batch_id = :b AND status = 'running' "
            "AND lease_owner IS NOT NULL",
            b=self.batch_id,
        )
        return str(rows[0].lease_owner) if rows else None


def wait_both_workers(watch: ClaimWatch, timeout: float = 60.0) -> None:
    wait_for("both replicas' workers running lines at once", lambda: watch.together, timeout, 0.05)


def ledger_of_batch(stack: ProductionStack, batch_id: str) -> list[Any]:
    return stack.rows(
        "SELECT request_id, prompt_tokens, cost FROM usage_records WHERE batch_id = :b",
        b=batch_id,
    )


def line_states(stack: ProductionStack, batch_id: str) -> list[Any]:
    return stack.rows(
        "SELECT line, custom_id, status, attempts, result IS NOT NULL AS has_result "
        "FROM batch_lines WHERE batch_id = :b ORDER BY line",
        b=batch_id,
    )


def settle_ledger(stack: ProductionStack, batch_id: str, expected: int) -> list[Any]:
    """The batch's ledger rows (written with each line's result, so no spool wait)."""
    rows = ledger_of_batch(stack, batch_id)
    assert len(rows) == expected, (len(rows), expected)
    return rows


def now() -> float:
    return time.monotonic()
