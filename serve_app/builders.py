"""Serve config entry point: ``import_path: serve_app.builders:build_gateway_app``.

Builds one head deployment per own-fleet catalog model (every kind of
``serve_app.contract.head_kinds``) and the gateway ingress bound to their
handles, so the Ray dashboard shows the gateway and one deployment per model.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from deployments import registry
from deployments.chat import prefix_router
from deployments.sleep_policy import with_sleep_policy
from deployments.tool_runner import ToolRunner
from serve_app.adapters.store import open_head_objects
from serve_app.catalog.config import CatalogModel, DeploymentSpec
from serve_app.composition import stand_in_refusals
from serve_app.config import GatewayAppArgs, ToolRunnerOptions
from serve_app.contract.head_kinds import HEAD_KINDS
from serve_app.ingress.deployment import Gateway
from serve_app.jobs.store import open_worker_stores
from serve_app.settings import GatewaySettings, require_production_ready

logger = logging.getLogger(__name__)

HEAD_DEPLOYMENTS: dict[str, Any] = {
    spec.name: registry.load(spec.deployment) for spec in HEAD_KINDS
}
"""Head kind -> its Ray Serve deployment, as the contract's table names it (importing a
head module imports no model runtime: engines are built in the replica)."""


def check_engine(model: CatalogModel) -> None:
    """Refuse an unknown backend, or engine settings its config class rejects, when the
    app is built: a typo in a catalog's ``engine.config`` would otherwise pass here and
    crash every replica at start (``deployments.registry``: the same validation the
    replica runs, with no model runtime imported)."""
    backend = model.engine.backend
    try:
        registry.validate_config(model.head, backend, model.engine.config)
    except ValidationError as exc:
        fields = "; ".join(
            f"engine.config.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            for err in exc.errors()
        )
        raise ValueError(f"{model.id}: {backend} engine settings are invalid: {fields}") from None
    except ValueError as exc:
        raise ValueError(f"{model.id}: {exc}") from None


def head_application(
    model: CatalogModel,
    max_audio_seconds: float | None = None,
    video_options: dict[str, Any] | None = None,
) -> Application | None:
    """The bound head deployment for one model, or None where no head runs here."""
    if model.is_external:
        return None
    if model.head not in HEAD_DEPLOYMENTS:
        logger.warning("no head implementation for %s models yet; %s skipped", model.head, model.id)
        return None
    check_engine(model)
    spec = model.deployment
    options: dict[str, Any] = {
        "name": model.deployment_name(),
        "max_ongoing_requests": spec.max_ongoing_requests,
        "ray_actor_options": spec.ray_actor_options,
        "health_check_period_s": spec.health_check_period_s,
        "health_check_timeout_s": spec.health_check_timeout_s,
    }
    if spec.autoscaling_config is not None:  # a head that sleeps also obeys sleep orders
        options["autoscaling_config"] = with_sleep_policy(
            spec.autoscaling_config, pinned=model.pinned
        )
    else:
        options["num_replicas"] = spec.num_replicas
    router = request_router_config(model)
    if router is not None:
        options["request_router_config"] = router
    head = HEAD_DEPLOYMENTS[model.head].options(**options)
    if model.head == "transcription" and max_audio_seconds is not None:
        return head.bind(model.id, model.engine.backend, model.engine.config, max_audio_seconds)
    if model.head == "chat":
        config = model.engine.config
        if model.adapter_head_id is not None:  # adapters have their own head: no LoRA here
            config = {k: v for k, v in config.items() if k != "lora"}
        # Heads serving LoRA adapters fetch uploaded ones from the gateway's store.
        objects = open_head_objects if config.get("lora") is not None else None
        return head.bind(
            model.id,
            model.engine.backend,
            config,
            spec.stream_batch_ms,
            open_adapter_objects=objects,
        )
    if model.head == "video":  # the worker's pacing must agree with the gateway's
        return head.bind(
            model.id,
            model.engine.backend,
            model.engine.config,
            video_options or {},
            open_worker_stores,
        )
    return head.bind(model.id, model.engine.backend, model.engine.config)


ADAPTER_HEAD_AUTOSCALING: dict[str, Any] = {
    "min_replicas": 0,
    "initial_replicas": 0,
    "max_replicas": 1,
    "upscale_delay_s": 0,
    "downscale_delay_s": 600,
    "downscale_to_zero_delay_s": 600,
}
"""An adapter head sleeps until the first adapter request and after 10 idle minutes, as
the catalog's secondary heads do (configs/catalog/local.yaml)."""


def adapter_head_application(model: CatalogModel) -> Application | None:
    """The LoRA-enabled head serving ``model``'s adapters (``<deployment>-lora``), where the
    model's own head runs without LoRA (``deployment.adapters_head: separate``); else None.

    Why a second deployment: vLLM's LoRA layers run their gathers and einsums on every
    linear layer for every token, adapter or not, so LoRA on the base model's replicas
    cost base traffic ~10% of its tokens/s (bench/RESULTS.md, "LoRA and base traffic").
    This head sleeps when idle and is counted by the memory budget like any sleeping head
    (``serve_app.heads.budget.budget_heads``); one replica, Serve's multiplexing choosing
    among nothing, so no request router.
    """
    head_id = model.adapter_head_id
    if head_id is None:
        return None
    spec = model.deployment
    options: dict[str, Any] = {
        "name": model.head_deployments()[head_id],
        "max_ongoing_requests": spec.max_ongoing_requests,
        "ray_actor_options": spec.ray_actor_options,
        "health_check_period_s": spec.health_check_period_s,
        "health_check_timeout_s": spec.health_check_timeout_s,
        "autoscaling_config": with_sleep_policy(ADAPTER_HEAD_AUTOSCALING),
    }
    chat_head = HEAD_DEPLOYMENTS["chat"].options(**options)
    return chat_head.bind(
        model.id,
        model.engine.backend,
        model.engine.config,
        spec.stream_batch_ms,
        open_adapter_objects=open_head_objects,
    )


def may_scale_out(spec: DeploymentSpec) -> bool:
    """Whether the deployment can ever have more than one replica to choose from."""
    if spec.autoscaling_config is not None:
        return int(spec.autoscaling_config.get("max_replicas", 1)) > 1
    return spec.num_replicas == "auto" or (spec.num_replicas or 1) > 1


def request_router_config(model: CatalogModel) -> RequestRouterConfig | None:
    """Chat heads with ``routing: prefix`` and room for two replicas: the prefix-,
    adapter- and organization-aware router (deployments/chat/prefix_router.py); else
    None, Serve's default (with one replica a router has nothing to choose, and the
    prefix router would still pay its tree lookups)."""
    spec = model.deployment
    if model.head != "chat" or model.routing != "prefix" or not may_scale_out(spec):
        return None
    fields: dict[str, Any] = {  # Ray's stubs type the class field wrongly (a dict)
        "request_router_class": prefix_router.ROUTER_CLASS,
        "request_router_kwargs": prefix_router.router_kwargs(
            spec.routing_imbalance, spec.routing_tree_chars
        ),
    }
    return RequestRouterConfig(**fields)


def build_gateway_app(args: dict[str, Any]) -> Application:
    """Validate ``args`` (pydantic) and bind the gateway with its heads.

    In ``deployment_mode: production`` the environment is checked first: ``serve deploy``
    then fails (DEPLOY_FAILED, the reason in ``serve status``) instead of coming up on
    SQLite and in-process counters.
    """
    config = GatewayAppArgs.model_validate(args)
    production = config.deployment_mode == "production"
    if production:
        require_production_ready(GatewaySettings(), stand_in_refusals(config.catalog))
    heads: dict[str, Application] = {}
    for model in config.catalog:
        app = head_application(
            model, config.audio.max_audio_seconds, config.video.model_dump(mode="json")
        )
        if app is not None:
            heads[model.id] = app
        adapters = adapter_head_application(model)
        if adapters is not None and model.adapter_head_id is not None:
            heads[model.adapter_head_id] = adapters
    ingress = config.ingress
    runner = tool_runner_application(
        config.tool_runner, config.tools.code_interpreter.model_dump(), production=production
    )
    return Gateway.options(  # type: ignore[attr-defined]
        num_replicas=ingress.num_replicas,
        max_ongoing_requests=ingress.max_ongoing_requests,
        ray_actor_options=ingress.ray_actor_options,
    ).bind(config.model_dump(mode="json"), heads, runner)


def tool_runner_application(
    options: ToolRunnerOptions, sandbox_options: dict[str, Any], *, production: bool = False
) -> Application | None:
    """The code sandbox's deployment, or None where the ingress runs it in-process;
    ``production``: its replicas refuse to start without the sandbox's network."""
    if not options.enabled:
        return None
    return ToolRunner.options(  # type: ignore[attr-defined]
        name="tool-runner",
        num_replicas=options.num_replicas,
        max_ongoing_requests=options.max_ongoing_requests,
        ray_actor_options=options.ray_actor_options,
    ).bind(sandbox_options, production)
