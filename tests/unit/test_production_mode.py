"""deployment_mode: production refuses the one-machine defaults and fails limits closed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import prometheus_client
import pytest
import yaml

from serve_app.auth.principal import Principal, UserLimits
from serve_app.config import REPO_ROOT, GatewayAppArgs
from serve_app.inference.metering import build_metering
from serve_app.limits.buckets import BucketSpec, Denial, Ticket
from serve_app.metrics import GatewayMetrics, PrometheusBackend
from serve_app.protocol.errors import ModelUnavailableError
from serve_app.settings import (
    GatewaySettings,
    ProductionRefused,
    production_refusals,
    require_production_ready,
)

PRODUCTION_ENV = {
    "GATEWAY_DATABASE_URL": "postgresql+psycopg://gw:pw@db.internal:5432/gateway",
    "GATEWAY_REDIS_URL": "redis://redis.internal:6379/0",
    "GATEWAY_OBJECT_STORE": "s3",
    "GATEWAY_S3_BUCKET": "videos",
}


def _production_args() -> dict[str, Any]:
    data = yaml.safe_load((REPO_ROOT / "configs" / "production.yaml").read_text())
    return dict(data["applications"][0]["args"])


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*PRODUCTION_ENV, "GATEWAY_S3_PREFIX", "GATEWAY_OUTBOUND_ALLOW_LOOPBACK_FOR_TESTS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_shipped_production_config_is_in_production_mode() -> None:
    config = GatewayAppArgs.model_validate(_production_args())
    assert config.deployment_mode == "production"
    assert config.limits.fail_open is False


def test_production_defaults_limits_to_closed_but_keeps_an_explicit_choice() -> None:
    assert GatewayAppArgs().limits.fail_open is True  # local: a laptop keeps serving
    closed = GatewayAppArgs(deployment_mode="production")
    assert closed.limits.fail_open is False
    chosen = GatewayAppArgs.model_validate(
        {"deployment_mode": "production", "limits": {"fail_open": True}}
    )
    assert chosen.limits.fail_open is True
    # The replicas receive the dumped args: the resolved value survives the round trip.
    again = GatewayAppArgs.model_validate(closed.model_dump(mode="json"))
    assert again.limits.fail_open is False


def test_every_one_machine_default_is_refused_by_name(bare_env: pytest.MonkeyPatch) -> None:
    problems = production_refusals(GatewaySettings())
    joined = "\n".join(problems)
    assert len(problems) == 3, joined
    for name in ("GATEWAY_DATABASE_URL", "GATEWAY_REDIS_URL", "GATEWAY_OBJECT_STORE"):
        assert name in joined


def test_sqlite_url_and_a_bucketless_s3_store_are_refused(bare_env: pytest.MonkeyPatch) -> None:
    settings = GatewaySettings(
        database_url="sqlite:////tmp/gw.db", redis_url="redis://r:6379/0", object_store="s3"
    )
    problems = production_refusals(settings)
    assert [p.split(" ")[0] for p in problems] == ["GATEWAY_DATABASE_URL", "GATEWAY_S3_BUCKET"]


def test_a_complete_environment_passes(bare_env: pytest.MonkeyPatch) -> None:
    for name, value in PRODUCTION_ENV.items():
        bare_env.setenv(name, value)
    assert production_refusals(GatewaySettings()) == []
    require_production_ready(GatewaySettings())


def test_the_loopback_test_switch_is_refused(bare_env: pytest.MonkeyPatch) -> None:
    for name, value in PRODUCTION_ENV.items():
        bare_env.setenv(name, value)
    bare_env.setenv("GATEWAY_OUTBOUND_ALLOW_LOOPBACK_FOR_TESTS", "1")
    problems = production_refusals(GatewaySettings())
    assert [p.split(" ")[0] for p in problems] == ["GATEWAY_OUTBOUND_ALLOW_LOOPBACK_FOR_TESTS"]


def test_the_builder_refuses_a_production_start_without_the_database_url(
    bare_env: pytest.MonkeyPatch,
) -> None:
    from serve_app.builders import build_gateway_app

    for name, value in PRODUCTION_ENV.items():
        if name != "GATEWAY_DATABASE_URL":
            bare_env.setenv(name, value)
    with pytest.raises(ProductionRefused) as refused:
        build_gateway_app(_production_args())
    message = str(refused.value)
    assert "GATEWAY_DATABASE_URL is unset" in message
    assert "GATEWAY_REDIS_URL" not in message


class _DownStore:
    async def admit(self, member: str, buckets: Sequence[BucketSpec], cost: int) -> Ticket | Denial:
        raise ConnectionError("redis down")

    async def settle(self, ticket: Ticket, used: int) -> None:
        raise ConnectionError("redis down")

    async def aclose(self) -> None:
        return None


def _limited() -> Principal:
    return Principal(
        key_id="key_1",
        user_id="usr_1",
        org_id="org_1",
        role="member",
        scopes=frozenset({"inference"}),
        user_limits=UserLimits(),
        key_rpm=5,
    )


def _fail_open_count(registry: prometheus_client.CollectorRegistry) -> float:
    value = registry.get_sample_value("gateway_limits_fail_open_total", {"phase": "admit"})
    return value or 0.0


@pytest.mark.parametrize("mode", ["local", "production"])
async def test_an_open_limit_path_is_counted_and_production_fails_closed(
    mode: str, tmp_path: Any
) -> None:
    registry = prometheus_client.CollectorRegistry()
    config = GatewayAppArgs.model_validate({"deployment_mode": mode, "ledger": {"enabled": False}})
    metering = build_metering(
        config,
        database=None,  # type: ignore[arg-type]  # the ledger is off: no database use
        settings=GatewaySettings(state_dir=tmp_path),
        counters=_DownStore(),
        metrics=GatewayMetrics(PrometheusBackend(registry)),
    )
    assert metering.limiter is not None
    if mode == "local":
        assert await metering.limiter.admit(_limited(), "req-1", 10) is None
        assert _fail_open_count(registry) == 1
    else:
        with pytest.raises(ModelUnavailableError):
            await metering.limiter.admit(_limited(), "req-1", 10)
        assert _fail_open_count(registry) == 0


STAND_IN_CATALOG: list[dict[str, Any]] = [
    {
        "id": "scripted-class",
        "head": "chat",
        "context_length": 64,
        "max_output_tokens": 8,
        "engine": {"backend": "tests.fakes.scripted_engine:ScriptedEngine"},
    },
    {
        "id": "tiny-ocr",
        "head": "parse",
        "pricing": {"per_image": 0.001},
        "engine": {
            "backend": "vision-encoder-decoder",
            "config": {"model": "tiny:vision-encoder-decoder", "field": "text", "device": "cpu"},
        },
    },
]


def test_production_refuses_test_engines_and_tiny_models(bare_env: pytest.MonkeyPatch) -> None:
    """A scripted engine or a random-weight model answers 200 with meaningless output: the
    builder refuses to start a production gateway with one, naming each."""
    from serve_app.builders import build_gateway_app

    for name, value in PRODUCTION_ENV.items():
        bare_env.setenv(name, value)
    args = {"deployment_mode": "production", "catalog": STAND_IN_CATALOG}
    with pytest.raises(ProductionRefused) as refused:
        build_gateway_app(args)
    lines = [line for line in str(refused.value).splitlines() if line.startswith("  - ")]
    assert len(lines) == 2, lines
    assert "model scripted-class: engine.backend tests.fakes.scripted_engine:Scripted" in lines[0]
    assert "model tiny-ocr: tiny:vision-encoder-decoder is a random-weight" in lines[1]
    build_gateway_app({**args, "deployment_mode": "local"})  # locally they are the demos


def test_the_shipped_production_catalog_has_no_stand_ins() -> None:
    from serve_app.composition import stand_in_refusals

    assert stand_in_refusals(GatewayAppArgs.model_validate(_production_args()).catalog) == []
    local = yaml.safe_load((REPO_ROOT / "configs" / "local.yaml").read_text())
    local_args = GatewayAppArgs.model_validate(local["applications"][0]["args"])
    assert stand_in_refusals(local_args.catalog)  # the CPU demos: refused, were it production


def test_production_refuses_the_no_op_metrics_backend(tmp_path: Any) -> None:
    from serve_app.metrics import NoopBackend

    def build(mode: str) -> None:
        config = GatewayAppArgs.model_validate(
            {"deployment_mode": mode, "ledger": {"enabled": False}}
        )
        build_metering(
            config,
            database=None,  # type: ignore[arg-type]  # the ledger is off: no database use
            settings=GatewaySettings(state_dir=tmp_path),
            counters=_DownStore(),
            metrics=GatewayMetrics(NoopBackend()),
        )

    with pytest.raises(ProductionRefused, match="no metrics backend"):
        build("production")
    build("local")  # a laptop without prometheus_client still serves


def test_production_refuses_a_sandbox_without_slirp4netns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Locally a missing slirp4netns leaves code runs with no network (logged); in production
    the tool runner does not start."""
    from deployments.sandbox import network
    from deployments.tool_runner import ToolRunnerCore

    monkeypatch.setattr(network.shutil, "which", lambda name: None)
    local = ToolRunnerCore({"network": "slirp"})
    assert type(local.sandbox.network) is network.SandboxNetwork  # the silent downgrade
    with pytest.raises(network.SandboxNetworkMissing, match="slirp4netns is not installed"):
        ToolRunnerCore({"network": "slirp"}, production=True)
    chosen = ToolRunnerCore({"network": "none"}, production=True)  # no network, as chosen
    assert type(chosen.sandbox.network) is network.SandboxNetwork


def test_the_builder_tells_the_tool_runner_it_is_production(bare_env: pytest.MonkeyPatch) -> None:
    from serve_app.builders import build_gateway_app

    for name, value in PRODUCTION_ENV.items():
        bare_env.setenv(name, value)
    gateway = build_gateway_app(_production_args())._bound_deployment
    runner = gateway.init_args[2]._bound_deployment
    assert runner.init_args[1] is True
