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
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import uvicorn
from playwright.sync_api import Browser, BrowserType, Playwright, expect, sync_playwright

from serve_app.auth.accounts import AccountStore
from serve_app.auth.sessions import SessionStore
from serve_app.billing.ledger import UsageLedger
from tests.fixtures.adapters import lora_catalog, operator_adapter_dir
from tests.fixtures.dashboard import PASSWORD
from tests.fixtures.gateway import add_keys, build_harness, start_heads
from tests.unit.dedicated.conftest import DedicatedHarness
from tests.unit.dedicated.conftest import build as build_dedicated

CHROMIUM = "/usr/bin/chromium"


# A loaded CI box (or this 2-core one shared by many) can take over Playwright's default
# 5 s for a page's first scripts; waits still end as soon as the condition holds.
expect.set_options(timeout=20_000)


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
    app: Any
    store: AccountStore
    url: str
    loop: asyncio.AbstractEventLoop

    def run(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop (where the app's ledger and heads live)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def ledger(self) -> UsageLedger:
        """The app's usage ledger, its spooled records committed first (as its flusher
        does each second)."""
        ledger = self.app.state.gateway.text.metering.ledger
        assert ledger is not None
        self.run(ledger.flush())
        return cast(UsageLedger, ledger)

    def user(self, name: str, org: str, role: str) -> str:
        """A member of ``org`` with ``role`` who signs in with ``PASSWORD``; their id."""
        self.store.set_membership(name, org, role)
        sessions: SessionStore = self.app.state.gateway.dashboard.sessions.store
        return sessions.set_password(name, PASSWORD)


@contextlib.contextmanager
def serving(
    app: Any,
    store: AccountStore,
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
) -> Iterator[LiveGateway]:
    """``app`` on a free local port, in a thread with its own event loop."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    loops: list[asyncio.AbstractEventLoop] = []

    async def serve() -> None:
        loops.append(asyncio.get_running_loop())
        await start()
        try:
            await server.serve()
        finally:
            await stop()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    for _ in range(300):
        if server.started or not thread.is_alive():
            break
        threading.Event().wait(0.05)
    assert server.started, "the gateway did not start serving"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield LiveGateway(app, store, f"http://127.0.0.1:{port}", loops[0])
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def live_gateway(tmp_path: Path) -> Iterator[LiveGateway]:
    """The scripted gateway (tests/fixtures/gateway.py) with its usual keys."""
    harness = build_harness(tmp_path / "gw.db")
    add_keys(harness)
    with serving(harness.app, harness.store, lambda: start_heads(harness), harness.aclose) as live:
        yield live


@pytest.fixture
def live_lora(tmp_path: Path) -> Iterator[LiveGateway]:
    """A scripted gateway whose base model serves LoRA adapters (tests/fixtures/adapters.py)."""
    catalog = lora_catalog(operator_adapter_dir(tmp_path))
    harness = build_harness(tmp_path / "gw.db", {"catalog": catalog})
    with serving(harness.app, harness.store, lambda: start_heads(harness), harness.aclose) as live:
        yield live


@pytest.fixture
def live_dedicated(tmp_path: Path) -> Iterator[tuple[LiveGateway, DedicatedHarness]]:
    """The gateway with dedicated endpoints on a fake Serve backend
    (tests/unit/dedicated/conftest.py)."""
    harness = build_dedicated(tmp_path)

    async def start() -> None:
        return None

    async def stop() -> None:
        await harness.dedicated.router.stop()
        await harness.app.state.gateway.text.metering.aclose()

    with serving(harness.app, harness.store, start, stop) as live:
        yield live, harness
