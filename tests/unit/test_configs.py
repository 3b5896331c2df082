"""Every ops file in the repository validates the way its consumer will read it.

- Serve configs (``configs/*.yaml`` with ``applications``): Ray Serve's own schema, with unknown
  keys refused (Serve ignores them silently for forward compatibility, so a typo would deploy),
  and each gateway application's ``args`` through ``GatewayAppArgs``.
- Catalog files (``configs/**`` with ``models``): ``CatalogModel``, unique ids, and each
  own-fleet chat model's engine config through the vLLM backend's own pydantic model.
- ``cluster.yaml``: Ray's cluster-launcher JSON schema and the checks ``ray up`` runs before it
  talks to AWS.

Nothing here starts Ray.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from ray.serve.config import AutoscalingConfig
from ray.serve.schema import (
    HTTPOptionsSchema,
    LoggingConfig,
    RayActorOptionsSchema,
    ServeApplicationSchema,
    ServeDeploySchema,
)

from serve_app.catalog.config import CatalogModel
from serve_app.config import REPO_ROOT, GatewayAppArgs

CONFIGS = REPO_ROOT / "configs"
CLUSTER_YAML = REPO_ROOT / "cluster.yaml"
GATEWAY_BUILDER = "serve_app.builders:build_gateway_app"
PRICE_FIELD_FOR_HEAD = {
    "speech": "per_audio_second",
    "transcription": "per_audio_second",
    "video": "per_video_second",
    "detect": "per_image",
    "parse": "per_image",
    "pooling": "input_per_mtok",  # embeddings and scores: per input token
}
# Resources Ray itself defines; anything else in `resources` must come from cluster.yaml.
BUILTIN_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory"}


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path} is not a YAML mapping"
    return data


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


ALL_YAML = sorted([*CONFIGS.rglob("*.yaml"), *CONFIGS.rglob("*.yml")])
SERVE_CONFIGS = [p for p in ALL_YAML if "applications" in _load(p)]
CATALOG_FILES = [p for p in ALL_YAML if "models" in _load(p)]


def _gateway_apps(path: Path) -> list[dict[str, Any]]:
    return [a for a in _load(path)["applications"] if a.get("import_path") == GATEWAY_BUILDER]


def _catalog_entries(path: Path) -> list[dict[str, Any]]:
    return list(_load(path)["models"])


def _assert_known_keys(data: dict[str, Any], schema: type[BaseModel], where: str) -> None:
    unknown = sorted(set(data) - set(schema.model_fields))
    assert not unknown, f"{where}: unknown keys {unknown} (allowed: {sorted(schema.model_fields)})"


def _custom_resources(ray_actor_options: dict[str, Any]) -> set[str]:
    return set(ray_actor_options.get("resources", {})) - BUILTIN_RESOURCES


# ---------------------------------------------------------------------------- discovery


def test_every_yaml_under_configs_is_a_serve_config_or_a_catalog() -> None:
    assert ALL_YAML, "no YAML found under configs/"
    unknown = [_rel(p) for p in ALL_YAML if p not in SERVE_CONFIGS and p not in CATALOG_FILES]
    assert not unknown, f"neither `applications` nor `models` at the top: {unknown}"
    assert CONFIGS / "local.yaml" in SERVE_CONFIGS
    assert CONFIGS / "production.yaml" in SERVE_CONFIGS
    assert CONFIGS / "catalog" / "production.yaml" in CATALOG_FILES


# ---------------------------------------------------------------------------- Serve configs


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=_rel)
def test_serve_config_matches_ray_serve_schema(path: Path) -> None:
    data = _load(path)
    ServeDeploySchema.model_validate(data)
    _assert_known_keys(data, ServeDeploySchema, _rel(path))
    _assert_known_keys(data.get("http_options", {}), HTTPOptionsSchema, "http_options")
    _assert_known_keys(data.get("logging_config", {}), LoggingConfig, "logging_config")
    for app in data["applications"]:
        _assert_known_keys(app, ServeApplicationSchema, f"application {app.get('name')}")


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=_rel)
def test_gateway_args_validate(path: Path) -> None:
    apps = _gateway_apps(path)
    assert apps, f"{_rel(path)} deploys no gateway application"
    for app in apps:
        for name in app["args"].get("catalog_files", []):
            assert (REPO_ROOT / name).is_file(), f"catalog file {name} does not exist"
        config = GatewayAppArgs.model_validate(app["args"])
        assert config.catalog, f"{_rel(path)}: the gateway would start with an empty catalog"
        options = config.ingress.ray_actor_options
        _assert_known_keys(options, RayActorOptionsSchema, "ingress.ray_actor_options")
        RayActorOptionsSchema.model_validate(options)


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=_rel)
def test_runtime_env_vars_are_strings(path: Path) -> None:
    # Ray refuses a non-string env var value at deploy time, after the config was accepted.
    for app in _load(path)["applications"]:
        env_vars = app.get("runtime_env", {}).get("env_vars", {})
        assert all(isinstance(v, str) for v in env_vars.values()), env_vars


# What cluster.yaml's env file provides; production-mode builds refuse to bind without it.
PRODUCTION_ENV = {
    "GATEWAY_DATABASE_URL": "postgresql+psycopg://gateway:pw@db.internal:5432/gateway",
    "GATEWAY_REDIS_URL": "redis://redis.internal:6379/0",
    "GATEWAY_OBJECT_STORE": "s3",
    "GATEWAY_S3_BUCKET": "gateway-videos",
}


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=_rel)
def test_builder_binds_a_serve_application_without_ray(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray
    from ray.serve import Application

    from serve_app.builders import build_gateway_app

    for name, value in PRODUCTION_ENV.items():
        monkeypatch.setenv(name, value)
    for app_config in _gateway_apps(path):
        app = build_gateway_app(app_config["args"])
        assert isinstance(app, Application)
    assert not ray.is_initialized(), "binding the application must not start Ray"


# ---------------------------------------------------------------------------- catalogs


@pytest.mark.parametrize("path", CATALOG_FILES, ids=_rel)
def test_catalog_entries_validate_with_unique_ids(path: Path) -> None:
    models = [CatalogModel.model_validate(entry) for entry in _catalog_entries(path)]
    assert models, f"{_rel(path)} lists no models"
    ids = [m.id for m in models]
    assert len(ids) == len(set(ids)), f"duplicate ids in {_rel(path)}: {ids}"


THINK_TAG_PARSERS = ("deepseek_r1", "qwen3")
"""vLLM 0.32 reasoning parsers that split a <think>...</think> block."""


@pytest.mark.parametrize("path", CATALOG_FILES, ids=_rel)
def test_own_fleet_chat_engines_validate_against_the_vllm_backend(path: Path) -> None:
    vllm_config = pytest.importorskip("deployments.chat.vllm_config")
    checked = 0
    for model in map(CatalogModel.model_validate, _catalog_entries(path)):
        if model.head != "chat" or model.is_external:
            continue
        assert model.engine.backend == "vllm", f"{model.id}: backend {model.engine.backend}"
        engine = vllm_config.VLLMEngineConfig.model_validate(model.engine.config)
        # The window published in /v1/models is the one the engine enforces.
        assert engine.max_model_len == model.context_length, model.id
        assert model.max_output_tokens is not None
        assert model.context_length is not None
        assert model.max_output_tokens < model.context_length, model.id
        # The card's reasoning promise is the engine's parser: a separate channel exactly
        # where one runs, and <think> tags split by a parser that reads them.
        parser = engine.effective_reasoning_parser()
        assert model.reasoning.separate_channel == (parser is not None), model.id
        if model.reasoning.format == "think_tags":
            assert parser in THINK_TAG_PARSERS, model.id
        checked += 1
    assert checked, f"{_rel(path)} has no own-fleet chat model"


@pytest.mark.parametrize("path", CATALOG_FILES, ids=_rel)
def test_head_deployment_options_are_valid_ray_serve_options(path: Path) -> None:
    for model in map(CatalogModel.model_validate, _catalog_entries(path)):
        spec = model.deployment
        _assert_known_keys(spec.ray_actor_options, RayActorOptionsSchema, model.id)
        RayActorOptionsSchema.model_validate(spec.ray_actor_options)
        if spec.autoscaling_config is not None:
            _assert_known_keys(spec.autoscaling_config, AutoscalingConfig, model.id)
            AutoscalingConfig.model_validate(spec.autoscaling_config)


@pytest.mark.parametrize("path", CATALOG_FILES, ids=_rel)
def test_every_non_chat_head_has_its_unit_price(path: Path) -> None:
    for model in map(CatalogModel.model_validate, _catalog_entries(path)):
        field = PRICE_FIELD_FOR_HEAD.get(model.head)
        if field is not None:
            assert getattr(model.pricing, field) is not None, f"{model.id}: no {field}"


@pytest.mark.parametrize("path", CATALOG_FILES, ids=_rel)
def test_cards_say_what_really_runs(path: Path) -> None:
    # Random weights (tiny:<kind> models) are published as demo with a notice, and a
    # substitute backend is never credited to the model it stands in for.
    for model in map(CatalogModel.model_validate, _catalog_entries(path)):
        source = str(model.engine.config.get("model", ""))
        if source.startswith("tiny:"):
            assert model.tier == "demo", f"{model.id} runs random weights ({source})"
            assert model.notice, model.id
        if model.engine.backend == "rapid-table":
            assert "SLANet-plus" in (model.publisher or ""), model.id
            assert "IBM" not in (model.publisher or ""), model.id
        if model.engine.backend == "rapid-layout":
            assert "RapidLayout" in (model.publisher or ""), model.id


def test_production_catalog_covers_every_head_and_an_external_model() -> None:
    models = [
        CatalogModel.model_validate(e)
        for e in _catalog_entries(CONFIGS / "catalog" / "production.yaml")
    ]
    assert {m.head for m in models} == set(PRICE_FIELD_FOR_HEAD) | {"chat"}
    external = [m for m in models if m.is_external]
    assert external and all(m.pricing.mode == "external" for m in external)
    for model in models:
        if model.head == "chat" and not model.is_external:
            options = model.deployment.ray_actor_options
            assert options.get("num_gpus", 0) >= 1, f"{model.id} would run on CPU"
            classes = _custom_resources(options) & {"capacity_reserved", "capacity_spot"}
            assert len(classes) == 1, f"{model.id}: pick exactly one capacity class"


# ---------------------------------------------------------------------------- cluster.yaml


def _ray_schema() -> dict[str, Any]:
    import ray.autoscaler

    schema_path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    return json.loads(schema_path.read_text())


def test_cluster_yaml_matches_ray_cluster_launcher_schema() -> None:
    import jsonschema

    jsonschema.validate(_load(CLUSTER_YAML), _ray_schema())


def test_cluster_yaml_passes_the_checks_ray_up_runs_first() -> None:
    # `ray up` fills in the provider's defaults, merges setup commands, then validates; the
    # AWS-specific bootstrap (IAM, subnets, key pairs) comes after and needs credentials.
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(_load(CLUSTER_YAML)))


def test_cluster_capacity_classes_and_ports() -> None:
    cluster = _load(CLUSTER_YAML)
    types = cluster["available_node_types"]
    head = types[cluster["head_node_type"]]
    assert head["resources"].get("GPU") == 0, "the head must not offer GPUs"
    assert types["gpu-reserved"]["resources"].get("capacity_reserved") == 1
    assert types["gpu-spot"]["resources"].get("capacity_spot") == 1
    spot_market = types["gpu-spot"]["node_config"]["InstanceMarketOptions"]["MarketType"]
    assert spot_market == "spot"
    assert "InstanceMarketOptions" not in types["gpu-reserved"]["node_config"]

    head_cmds = " ".join(cluster["head_start_ray_commands"])
    worker_cmds = " ".join(cluster["worker_start_ray_commands"])
    gcs_port = re.search(r"--port=(\d+)", head_cmds)
    assert gcs_port and gcs_port.group(1) != "6379", "GCS must not take Redis's port"
    assert f"$RAY_HEAD_IP:{gcs_port.group(1)}" in worker_cmds
    assert "--dashboard-port=8265" in head_cmds


def test_every_custom_resource_requested_is_offered_by_a_node_type() -> None:
    offered = {
        name
        for node_type in _load(CLUSTER_YAML)["available_node_types"].values()
        for name in node_type["resources"]
    }
    config = GatewayAppArgs.model_validate(_gateway_apps(CONFIGS / "production.yaml")[0]["args"])
    wanted = {
        "ingress": _custom_resources(config.ingress.ray_actor_options),
        "tool-runner": _custom_resources(config.tool_runner.ray_actor_options),
    }
    for model in config.catalog:
        if not model.is_external:
            wanted[model.id] = _custom_resources(model.deployment.ray_actor_options)
    missing = {who: sorted(names - offered) for who, names in wanted.items() if names - offered}
    assert not missing, f"no node type in cluster.yaml offers {missing}: replicas would hang"


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=_rel)
def test_the_code_sandbox_is_its_own_deployment(path: Path) -> None:

    for app_config in _gateway_apps(path):
        config = GatewayAppArgs.model_validate(app_config["args"])
        assert config.tool_runner.enabled, f"{_rel(path)} runs untrusted code in the ingress"
        options = config.tool_runner.ray_actor_options
        RayActorOptionsSchema.model_validate(options)
        if path.name == "local.yaml":  # one 2-core machine: a whole CPU would leave it pending
            assert 0 < options["num_cpus"] < 1


def test_tool_runners_land_on_cpu_nodes_that_install_the_sandbox() -> None:
    cluster = _load(CLUSTER_YAML)
    config = GatewayAppArgs.model_validate(_gateway_apps(CONFIGS / "production.yaml")[0]["args"])
    wanted = _custom_resources(config.tool_runner.ray_actor_options)
    assert wanted, "production tool runners must ask for a node type of their own"
    hosts = {
        name: node
        for name, node in cluster["available_node_types"].items()
        if wanted & set(node["resources"])
    }
    assert hosts, wanted
    for name, node in hosts.items():
        assert node["resources"].get("GPU", 0) == 0, f"{name}: code would run next to a model"
        assert name != cluster["head_node_type"], "untrusted code on the head node"
        assert "--device /dev/net/tun" in node["docker"]["worker_run_options"], name
    setup = " ".join(cluster["setup_commands"])
    assert "bubblewrap" in setup and "slirp4netns" in setup


def test_local_catalog_leaves_room_for_a_dedicated_endpoint_under_gateway_run() -> None:
    """A replica asking for more logical CPUs than are left waits in DEPLOYING without an
    error, so the embedded default must fit its whole catalog *and* a dedicated endpoint
    (the dedicated API's promise on `make run`) in what `gateway run` gives Ray."""
    from serve_app.cli.serve import default_num_cpus

    (app,) = _gateway_apps(CONFIGS / "local.yaml")
    config = GatewayAppArgs.model_validate(app["args"])

    def cpus(options: dict[str, Any] | None) -> float:
        return float((options or {}).get("num_cpus", 1))

    reserved = cpus(config.ingress.ray_actor_options) + cpus(config.tool_runner.ray_actor_options)
    reserved += sum(
        cpus(m.deployment.ray_actor_options) for m in config.catalog if not m.is_external
    )
    endpoint = max(
        cpus(m.ray_actor_options) for m in config.dedicated.models.values() if m.ray_actor_options
    )
    assert reserved + endpoint <= default_num_cpus(2), (reserved, endpoint)
