"""``deployment.routing`` of a catalog model: its validation (also by ``gateway check``)
and how the builder turns it into the head deployment's request router."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from deployments.chat import prefix_router
from serve_app.builders import head_application, request_router_config
from serve_app.catalog.config import CatalogModel
from serve_app.cli import main
from serve_app.settings import GatewaySettings


def chat(**deployment: Any) -> dict[str, Any]:
    return {
        "id": "smol",
        "head": "chat",
        "context_length": 2048,
        "max_output_tokens": 256,
        "engine": {"backend": "tests.fakes.scripted_engine:ScriptedEngine", "config": {}},
        "deployment": {"ray_actor_options": {"num_cpus": 0.1}, **deployment},
    }


def test_chat_models_default_to_prefix_and_others_to_pow2() -> None:
    assert CatalogModel.model_validate(chat()).routing == "prefix"
    assert CatalogModel.model_validate(chat(routing="pow2")).routing == "pow2"
    detect = {"id": "d", "head": "detect", "pricing": {"per_image": 0.001}}
    assert CatalogModel.model_validate(detect).routing == "pow2"


@pytest.mark.parametrize(
    "entry",
    [
        chat(routing="prefx"),
        chat(routing_imbalance=-1),
        chat(routing_tree_chars=10),
        {"id": "d", "head": "detect", "deployment": {"routing": "prefix"}},
    ],
)
def test_bad_routing_is_refused(entry: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CatalogModel.model_validate(entry)


def test_prefix_router_only_where_there_is_a_choice() -> None:
    one = CatalogModel.model_validate(chat(num_replicas=1))
    assert request_router_config(one) is None
    pow2 = CatalogModel.model_validate(chat(num_replicas=2, routing="pow2"))
    assert request_router_config(pow2) is None
    scaling = CatalogModel.model_validate(
        chat(num_replicas=None, autoscaling_config={"min_replicas": 1, "max_replicas": 3})
    )
    assert request_router_config(scaling) is not None
    two = CatalogModel.model_validate(chat(num_replicas=2, routing_imbalance=7))
    config = request_router_config(two)
    assert config is not None
    assert config.request_router_class == prefix_router.ROUTER_CLASS
    assert config.request_router_kwargs["imbalanced_threshold"] == 7
    assert config.get_request_router_class() is prefix_router.ChatPrefixRouter


def test_the_head_deployment_carries_the_router() -> None:
    app = head_application(CatalogModel.model_validate(chat(num_replicas=2)))
    assert app is not None
    deployment_config = app._bound_deployment._deployment_config
    router = deployment_config.request_router_config
    assert router.request_router_class == prefix_router.ROUTER_CLASS
    single = head_application(CatalogModel.model_validate(chat(num_replicas=1)))
    assert single is not None
    default = single._bound_deployment._deployment_config.request_router_config
    assert default.request_router_class != prefix_router.ROUTER_CLASS


def test_gateway_check_names_a_bad_routing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = {
        "name": "gateway",
        "route_prefix": "/",
        "import_path": "serve_app.builders:build_gateway_app",
        "args": {"catalog": [chat(routing="round-robin")]},
    }
    path = tmp_path / "routing.yaml"
    path.write_text(yaml.safe_dump({"applications": [app]}))
    settings = GatewaySettings(state_dir=tmp_path / "state")
    assert main(["check", "--config", str(path), "--offline"], settings=settings) == 1
    out = capsys.readouterr().out
    assert "deployment.routing" in out and "prefix" in out, out
