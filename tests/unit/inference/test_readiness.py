"""503 ``model_warming`` / ``model_unavailable`` from Serve's state (spec 7)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from serve_app.inference.readiness import (
    FAILED,
    READY,
    WARMING,
    HeadReadiness,
    HeadState,
    _classify,
)
from serve_app.protocol.errors import ModelUnavailableError
from tests.fixtures.gateway import GatewayHarness


def _dep(status: str, **replicas: int) -> SimpleNamespace:
    return SimpleNamespace(status=status, replica_states=replicas, message="boom")


def test_classify_serve_deployment_states() -> None:
    assert _classify(None).state == WARMING
    assert _classify(_dep("UPDATING", STARTING=1)).state == WARMING
    assert _classify(_dep("UPDATING", RUNNING=1, STARTING=1)).state == READY
    assert _classify(_dep("DeploymentStatus.DEPLOY_FAILED")).state == FAILED
    assert _classify(_dep("UNHEALTHY", STARTING=1)).state == FAILED
    assert _classify(_dep("HEALTHY")).state == READY  # scaled to zero: a call boots one


async def _polled(states: dict[str, HeadState]) -> HeadReadiness:
    readiness = HeadReadiness(lambda: states, refresh_s=0.01, warming_retry_after_s=7)
    readiness.check("any")  # starts the poll
    await asyncio.sleep(0.05)
    return readiness


async def test_check_raises_the_spec_errors() -> None:
    readiness = await _polled(
        {"a": HeadState(WARMING), "b": HeadState(FAILED, "crashed"), "c": HeadState(READY)}
    )
    with pytest.raises(ModelUnavailableError) as warming:
        readiness.check("a")
    assert warming.value.code == "model_warming"
    assert warming.value.headers == {"Retry-After": "7"}
    with pytest.raises(ModelUnavailableError) as failed:
        readiness.check("b")
    assert failed.value.code == "model_unavailable"
    readiness.check("c")


async def test_route_answers_503_while_warming(gateway: GatewayHarness) -> None:
    text = gateway.app.state.gateway.text
    text.readiness = await _polled({"scripted-chat": HeadState(WARMING)})
    body = {"model": "scripted-chat", "messages": [{"role": "user", "content": "hi"}]}
    async with gateway.client(gateway.keys["user"]) as http:
        resp = await http.post("/v1/chat/completions", json=body, timeout=5)
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "7"
    assert resp.json()["error"]["code"] == "model_warming"
