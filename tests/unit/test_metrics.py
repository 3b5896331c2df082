"""Gateway metrics: what the request path reports, and safe without Ray."""

from __future__ import annotations

import prometheus_client

from serve_app.metrics import (
    GatewayMetrics,
    NoopBackend,
    PrometheusBackend,
    RayBackend,
    default_backend,
)
from tests.fixtures.gateway import HarnessFactory

HELLO = {"model": "scripted-chat", "messages": [{"role": "user", "content": "hello there"}]}


def test_default_backend_without_ray_is_not_ray() -> None:
    backend = default_backend()
    assert not isinstance(backend, RayBackend)
    metrics = GatewayMetrics()
    metrics.request("m", "chat", "ok")  # must not raise without Ray
    metrics.latency("m", "chat", 0.2)


class ExplodingBackend(NoopBackend):
    def inc(self, name: str, value: float, tags: dict[str, str]) -> None:
        raise RuntimeError("exporter down")


def test_a_failing_backend_never_fails_the_request() -> None:
    GatewayMetrics(ExplodingBackend()).rate_limited("m", "rate_limit_exceeded")


async def test_requests_tokens_429s_and_latency_per_model(make_gateway: HarnessFactory) -> None:
    registry = prometheus_client.CollectorRegistry()
    gw = await make_gateway(metrics=GatewayMetrics(PrometheusBackend(registry)))
    gw.store.update_user("alice", rpm=2)
    async with gw.client(gw.keys["user"]) as http:
        assert (await http.post("/v1/chat/completions", json=HELLO)).status_code == 200
        bad = {**HELLO, "messages": [{"role": "user", "content": "#fail-before"}]}
        assert (await http.post("/v1/chat/completions", json=bad)).status_code == 502
        assert (await http.post("/v1/chat/completions", json=HELLO)).status_code == 429
        unknown = {**HELLO, "model": "no-such-model"}
        assert (await http.post("/v1/chat/completions", json=unknown)).status_code == 404

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    model = {"model": "scripted-chat"}
    assert value("gateway_requests_total", **model, endpoint="chat", outcome="ok") == 1
    assert value("gateway_requests_total", **model, endpoint="chat", outcome="rejected") == 1
    assert value("gateway_requests_total", **model, endpoint="chat", outcome="error") == 1
    assert value("gateway_rate_limited_total", **model, code="rate_limit_exceeded") == 1
    assert value("gateway_tokens_total", **model, kind="prompt") == 4
    assert value("gateway_tokens_total", **model, kind="completion") == 2
    # Answers from the head count (the 502 too); a 429 or 404 never reached it.
    assert value("gateway_request_latency_seconds_count", **model, endpoint="chat") == 2


def test_prometheus_exposition_names() -> None:
    registry = prometheus_client.CollectorRegistry()
    GatewayMetrics(PrometheusBackend(registry)).request("m", "chat", "ok")
    text = prometheus_client.generate_latest(registry).decode()
    assert 'gateway_requests_total{endpoint="chat",model="m",outcome="ok"} 1.0' in text
