"""The composition root hands every collaborator over at construction.

Dedicated routing is built first and its hooks are constructor arguments of the
catalog and the text service; the replay store built by the root is the one the
idempotency middleware answers from; the code sandbox is the one given, else the
in-process one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deployments.sandbox.bwrap import BwrapSandbox
from serve_app.composition import build_state, close_replica
from serve_app.config import GatewayAppArgs
from serve_app.inference.readiness import HeadReadiness
from serve_app.ingress.app import create_app
from serve_app.ingress.idempotency import IdempotencyMiddleware
from serve_app.requests.state import GatewayState
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database
from serve_app.tools.sandbox import RemoteSandbox
from tests.unit.dedicated.conftest import CATALOG, DEDICATED
from tests.unit.dedicated.fakes import FakeServeBackend


def _state(tmp_path: Path, **kwargs: Any) -> GatewayState:
    config = GatewayAppArgs.model_validate({"catalog": CATALOG, "dedicated": DEDICATED})
    settings = GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'gw.db'}", state_dir=tmp_path, redis_url=None
    )
    database = Database(settings.resolved_database_url())
    database.migrate()
    return build_state(config, {}, HeadReadiness(None), database, settings, **kwargs)


async def test_dedicated_hooks_are_constructor_arguments(tmp_path: Path) -> None:
    state = _state(tmp_path, dedicated_backend=FakeServeBackend())
    assert state.dedicated is not None
    router = state.dedicated.router
    assert state.catalog.alias_resolver == router.resolve_model
    assert state.text.head_lookup == router.head_for
    await close_replica(state)


async def test_without_dedicated_nothing_resolves_aliases(tmp_path: Path) -> None:
    state = _state(tmp_path)
    assert state.dedicated is None
    assert state.catalog.alias_resolver is None and state.text.head_lookup is None
    await close_replica(state)


async def test_the_idempotency_middleware_answers_from_the_roots_replay_store(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path)
    app = create_app(state, 1 << 20)
    [idempotency] = [m for m in app.user_middleware if m.cls is IdempotencyMiddleware]
    assert idempotency.kwargs["store"] is state.replays
    assert not hasattr(state.text.metering, "replays")
    await close_replica(state)


@pytest.mark.parametrize("remote", [True, False])
async def test_the_tools_run_code_in_the_given_sandbox_else_in_process(
    tmp_path: Path, remote: bool
) -> None:
    given = RemoteSandbox(handle=object()) if remote else None
    state = _state(tmp_path, sandbox=given)
    sandbox = state.responses.runtime.sandbox
    assert state.tool_chat.runtime.sandbox is sandbox
    if remote:
        assert sandbox is given
    else:
        assert isinstance(sandbox, BwrapSandbox)
    await close_replica(state)
