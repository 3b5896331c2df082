"""A chat model with ``lora`` serves base traffic from heads without LoRA and adapters from a
separate, sleeping adapter head (``deployment.adapters_head``, issue 43 item 4): the catalog's
head ids, the deployments the builder binds, the memory budget and the head clients."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from serve_app.builders import adapter_head_application, head_application
from serve_app.catalog.config import AdapterModel, CatalogModel
from serve_app.contract.adapters import AdapterRef
from serve_app.heads.budget import budget_heads
from serve_app.heads.client import ray_head_clients

LORA = {"max_lora_rank": 8, "max_loras": 2}


def chat(lora: bool = True, **deployment: Any) -> CatalogModel:
    config = {"lora": LORA} if lora else {}
    return CatalogModel.model_validate(
        {
            "id": "smol",
            "head": "chat",
            "context_length": 2048,
            "max_output_tokens": 256,
            "memory_gib": 2.5,
            "pinned": True,
            "engine": {"backend": "tests.fakes.scripted_engine:ScriptedEngine", "config": config},
            "deployment": {"ray_actor_options": {"num_cpus": 0.1}, **deployment},
        }
    )


def adapter_of(base: CatalogModel) -> AdapterModel:
    return AdapterModel.of(base, AdapterRef(key="lora-1", model_id=f"{base.id}:json"))


def test_adapters_get_their_own_head_by_default() -> None:
    assert chat().adapter_head_id == "smol+lora"  # measured: base traffic 1.010 vs 0.892
    assert chat(adapters_head="shared").adapter_head_id is None


def test_adapters_get_their_own_head_when_separate() -> None:
    model = chat(adapters_head="separate")
    assert model.adapter_head_id == "smol+lora"
    assert model.head_deployments() == {"smol": "chat-smol", "smol+lora": "chat-smol-lora"}
    assert adapter_of(model).head_id == "smol+lora"
    assert model.head_id == "smol"  # base traffic stays on the model's own head


def test_shared_or_no_lora_keeps_one_head() -> None:
    shared = chat(adapters_head="shared")
    assert shared.adapter_head_id is None
    assert adapter_of(shared).head_id == "smol"
    assert chat(lora=False).adapter_head_id is None
    assert chat(lora=False).head_deployments() == {"smol": "chat-smol"}


def test_an_id_cannot_pose_as_an_adapter_head() -> None:
    with pytest.raises(ValidationError, match=r"\+lora"):
        CatalogModel.model_validate(
            {**chat(adapters_head="separate").model_dump(), "id": "smol+lora"}
        )


def _init(app: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    deployment = app._bound_deployment
    return deployment.init_args, deployment.init_kwargs


def test_the_base_head_runs_without_lora_and_the_adapter_head_with_it() -> None:
    model = chat(adapters_head="separate")
    base = head_application(model)
    assert base is not None
    args, kwargs = _init(base)
    assert "lora" not in args[2] and kwargs["open_adapter_objects"] is None
    adapters = adapter_head_application(model)
    assert adapters is not None
    assert adapters._bound_deployment.name == "chat-smol-lora"
    args, kwargs = _init(adapters)
    assert args[2]["lora"] == LORA and kwargs["open_adapter_objects"] is not None
    autoscaling = adapters._bound_deployment._deployment_config.autoscaling_config
    assert autoscaling is not None
    assert autoscaling.min_replicas == 0 and autoscaling.initial_replicas == 0  # sleeps
    shared = head_application(chat(adapters_head="shared"))
    assert shared is not None and _init(shared)[0][2]["lora"] == LORA
    assert adapter_head_application(chat(adapters_head="shared")) is None


def test_the_memory_budget_counts_the_adapter_head_as_evictable() -> None:
    heads = budget_heads([chat(adapters_head="separate")])
    assert set(heads) == {"smol", "smol+lora"}
    assert not heads["smol"].evictable  # pinned
    assert heads["smol+lora"].evictable and heads["smol+lora"].memory_gib == 2.5


def test_the_adapter_head_gets_a_chat_client_of_its_own() -> None:
    handles = {"smol": object(), "smol+lora": object()}
    clients = ray_head_clients([chat(adapters_head="separate")], handles)
    assert set(clients.chat) == {"smol", "smol+lora"}
    assert clients.chat["smol"] is not clients.chat["smol+lora"]
