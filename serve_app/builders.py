"""Serve config entry point: ``import_path: serve_app.builders:build_gateway_app``.

Builds one head deployment per own-fleet catalog model (chat, speech,
transcription, detect, parse, video) and the gateway ingress bound to their
handles, so the Ray dashboard shows the gateway and one deployment per model.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve import Application

from deployments.chat_head import ChatHead
from deployments.document_head import DetectHead, ParseHead
from deployments.engines.audio_factory import is_known_backend
from deployments.engines.document_factory import is_known_document_backend
from deployments.engines.video_factory import is_known_video_backend
from deployments.speech_head import SpeechHead
from deployments.tool_runner import ToolRunner
from deployments.transcription_head import TranscriptionHead
from deployments.video_head import VideoHead
from serve_app.catalog.config import CatalogModel
from serve_app.config import GatewayAppArgs, ToolRunnerOptions
from serve_app.ingress.deployment import Gateway
from serve_app.jobs.store import open_worker_stores
from serve_app.settings import GatewaySettings, require_production_ready

logger = logging.getLogger(__name__)

HEAD_DEPLOYMENTS: dict[str, Any] = {
    "chat": ChatHead,
    "speech": SpeechHead,
    "transcription": TranscriptionHead,
    "detect": DetectHead,
    "parse": ParseHead,
    "video": VideoHead,
}
"""Head kind -> its Ray Serve deployment; every catalog head kind has one."""


def _is_known_backend(head: str, backend: str) -> bool:
    if head in ("detect", "parse"):
        return is_known_document_backend(head, backend)
    if head == "video":
        return is_known_video_backend(backend)
    return is_known_backend(head, backend)


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
    if model.head != "chat" and not _is_known_backend(model.head, model.engine.backend):
        raise ValueError(
            f"{model.id}: '{model.engine.backend}' is not a {model.head} engine backend."
        )
    spec = model.deployment
    options: dict[str, Any] = {
        "name": model.deployment_name(),
        "max_ongoing_requests": spec.max_ongoing_requests,
        "ray_actor_options": spec.ray_actor_options,
        "health_check_period_s": spec.health_check_period_s,
        "health_check_timeout_s": spec.health_check_timeout_s,
    }
    if spec.autoscaling_config is not None:
        options["autoscaling_config"] = spec.autoscaling_config
    else:
        options["num_replicas"] = spec.num_replicas
    head = HEAD_DEPLOYMENTS[model.head].options(**options)
    if model.head == "transcription" and max_audio_seconds is not None:
        return head.bind(model.id, model.engine.backend, model.engine.config, max_audio_seconds)
    if model.head == "chat":
        return head.bind(model.id, model.engine.backend, model.engine.config, spec.stream_batch_ms)
    if model.head == "video":  # the worker's pacing must agree with the gateway's
        return head.bind(
            model.id,
            model.engine.backend,
            model.engine.config,
            video_options or {},
            open_worker_stores,
        )
    return head.bind(model.id, model.engine.backend, model.engine.config)


def build_gateway_app(args: dict[str, Any]) -> Application:
    """Validate ``args`` (pydantic) and bind the gateway with its heads.

    In ``deployment_mode: production`` the environment is checked first: ``serve deploy``
    then fails (DEPLOY_FAILED, the reason in ``serve status``) instead of coming up on
    SQLite and in-process counters.
    """
    config = GatewayAppArgs.model_validate(args)
    if config.deployment_mode == "production":
        require_production_ready(GatewaySettings())
    heads: dict[str, Application] = {}
    for model in config.catalog:
        app = head_application(
            model, config.audio.max_audio_seconds, config.video.model_dump(mode="json")
        )
        if app is not None:
            heads[model.id] = app
    ingress = config.ingress
    runner = tool_runner_application(config.tool_runner, config.tools.code_interpreter.model_dump())
    return Gateway.options(  # type: ignore[attr-defined]
        num_replicas=ingress.num_replicas,
        max_ongoing_requests=ingress.max_ongoing_requests,
        ray_actor_options=ingress.ray_actor_options,
    ).bind(config.model_dump(mode="json"), heads, runner)


def tool_runner_application(
    options: ToolRunnerOptions, sandbox_options: dict[str, Any]
) -> Application | None:
    """The code sandbox's deployment, or None where the ingress runs it in-process."""
    if not options.enabled:
        return None
    return ToolRunner.options(  # type: ignore[attr-defined]
        name="tool-runner",
        num_replicas=options.num_replicas,
        max_ongoing_requests=options.max_ongoing_requests,
        ray_actor_options=options.ray_actor_options,
    ).bind(sandbox_options)
