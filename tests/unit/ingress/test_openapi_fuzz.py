"""Schemathesis against the in-process gateway: the OpenAPI document tells the truth.

The gateway app of ``tests.fixtures.gateway`` (real auth, limits, validation and
routing; scripted heads) is served on a loopback port, and the schemathesis CLI
runs against its ``/openapi.json`` exactly as an outside user would: every
operation, schema-valid (positive) and schema-invalid (negative) requests, every
check (``--checks all``): a schema-valid request refused, a schema-invalid one
accepted, any 5xx, an answer that does not match its documented schema, an
``OPTIONS`` or 405 whose ``Allow`` disagrees with the document... Examples are
bounded and the seed fixed, so the run is repeatable and takes well under a
minute.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from tests.fixtures.gateway import add_keys, build_harness, start_heads

MAX_EXAMPLES = 25
SEED = 16016


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def served_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, API key) of the harness app on uvicorn, in a thread with its own loop."""
    folder: Path = tmp_path_factory.mktemp("fuzz")
    harness = build_harness(folder / "gw.db")
    add_keys(harness)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(harness.app, host="127.0.0.1", port=port, log_level="warning")
    )

    async def serve() -> None:
        await start_heads(harness)  # on the serving loop
        try:
            await server.serve()
        finally:
            await harness.aclose()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/openapi.json", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield base, harness.keys["user"]
    server.should_exit = True
    thread.join(timeout=30)


def test_schemathesis_finds_no_failure(served_gateway: tuple[str, str], tmp_path: Path) -> None:
    base, key = served_gateway
    st = Path(sys.executable).with_name("st")
    run = subprocess.run(
        [
            str(st),
            "run",
            f"{base}/openapi.json",
            "--header",
            f"Authorization: Bearer {key}",
            "--checks",
            "all",
            "--mode",
            "all",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            str(SEED),
            "--workers",
            "1",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        # Loopback only: no proxy variable may send the fuzzer's requests elsewhere.
        env={k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
        cwd=tmp_path,  # its cache folder (.schemathesis) stays out of the checkout
        timeout=400,
        check=False,
    )
    summary = run.stdout[-6000:]
    assert run.returncode == 0, summary
    assert " passed" in summary and "failure" not in summary.split("SUMMARY")[-1], summary
