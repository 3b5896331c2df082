"""The dashboard in a real browser: Debian's chromium driven by Playwright.

The gateway is the in-process harness (the real app, auth, billing and catalog, scripted
chat heads: tests/fixtures/gateway.py) served on a free local port by uvicorn in a
thread, so the browser, the openai SDK and the test all talk to it over HTTP as a user
would. Playwright's own browser download is not reachable here: the system chromium
(`make install` puts it there) is launched by its path.

``GATEWAY_DASHBOARD_SCREENSHOTS=1`` makes the tests that visit a page save it to
docs/dashboard/<page>.png (docs/dashboard.md shows them).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.sync_api import Browser, BrowserType, Playwright, sync_playwright

from tests.fixtures.gateway import GatewayHarness, add_keys, build_harness, start_heads

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    """Playwright for one module, not pytest-playwright's one per session: its sync API
    keeps an event loop marked running on the main thread until it stops, and every
    asyncio test run after it (the rest of the suite) would fail to start its own."""
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser_type(playwright: Playwright) -> BrowserType:
    return playwright.chromium


@pytest.fixture(scope="module")
def browser(
    browser_type: BrowserType, browser_type_launch_args: dict[str, Any]
) -> Iterator[Browser]:
    browser = browser_type.launch(**browser_type_launch_args)
    yield browser
    browser.close()


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_type_launch_args, "executable_path": CHROMIUM}


@pytest.fixture(scope="module")
def browser_context_args() -> dict[str, Any]:
    # A small window keeps the screenshots small. (pytest-playwright's own asks for its
    # session-wide Playwright, for device emulation this suite does not use.)
    return {"viewport": {"width": 1000, "height": 720}}


@dataclass
class LiveGateway:
    harness: GatewayHarness
    url: str
    loop: asyncio.AbstractEventLoop

    def run(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop (where the app's ledger and heads live)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def flush_ledger(self) -> None:
        """Commit the spooled usage records, as the ledger's flusher does each second."""
        ledger = self.harness.metering.ledger
        assert ledger is not None
        self.run(ledger.flush())


@pytest.fixture
def live_gateway(tmp_path: Path) -> Iterator[LiveGateway]:
    harness = build_harness(tmp_path / "gw.db")
    add_keys(harness)
    config = uvicorn.Config(harness.app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    loops: list[asyncio.AbstractEventLoop] = []

    async def serve() -> None:
        loops.append(asyncio.get_running_loop())
        await start_heads(harness)
        try:
            await server.serve()
        finally:
            await harness.aclose()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    for _ in range(300):
        if server.started or not thread.is_alive():
            break
        threading.Event().wait(0.05)
    assert server.started, "the gateway did not start serving"
    port = server.servers[0].sockets[0].getsockname()[1]
    yield LiveGateway(harness, f"http://127.0.0.1:{port}", loops[0])
    server.should_exit = True
    thread.join(timeout=30)
