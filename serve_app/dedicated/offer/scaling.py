"""Scaling policies: presets, profile detection, bounds, and Serve's autoscaling_config.

A stored ``DedicatedScalingPolicy`` is the whole truth about an endpoint's
scaling; ``autoscaling_options`` derives the Ray Serve deployment options from
it on every reconcile, so a PATCH is just a new stored policy that the
reconciler applies in place (Serve's lightweight update: same code version and
actor options, new ``autoscaling_config`` -> no replica restarts).

Absent policy fields take the value of the endpoint's default preset. Presets
are clamped to the endpoint's ``target_inputs_max`` before they are published
or compared, so a preset is always a policy the endpoint accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serve_app.dedicated.options import DedicatedModelOptions, DedicatedOptions
from serve_app.protocol.dedicated import (
    DedicatedScalingBounds,
    DedicatedScalingPolicy,
    DedicatedScalingState,
    Mode,
    Profile,
    StateProfile,
)
from serve_app.protocol.errors import InvalidRequestError

TARGET_INPUTS_CEILING = 100
BUFFER_REPLICAS_MAX = 10
IDLE_MIN, IDLE_MAX = 30, 3600
QUEUE_DEPTH_MAX = 10000
ENGINE_WAITING_MAX = 1000
POLICY_FUNCTION = "serve_app.dedicated.control.autoscaling:DedicatedAutoscalingPolicy"
HEAD, BURST = "head", "burst"
"""Deployment names inside a ``ded-<slug>`` app: ``head`` serves every mode (the reserved
floor in hybrid), ``burst`` is hybrid's spot deployment."""


def target_inputs_max(admission: int) -> int:
    """docs/reference/dedicated.md#scaling-policy: min(100, admission bound)."""
    return min(TARGET_INPUTS_CEILING, admission)


def presets_for(
    options: DedicatedOptions, target_max: int, queue_signal: bool
) -> dict[Profile, DedicatedScalingPolicy]:
    """The presets as this endpoint can hold them (clamped; no queue knob without signal)."""
    result: dict[Profile, DedicatedScalingPolicy] = {}
    for name, preset in options.presets.items():
        values = preset.policy.set_fields()
        if "target_inputs" in values:
            values["target_inputs"] = min(values["target_inputs"], target_max)
        if not queue_signal:
            values.pop("engine_target_waiting", None)
        result[name] = DedicatedScalingPolicy(**values)
    return result


def scaling_bounds(
    options: DedicatedOptions, model: DedicatedModelOptions, admission: int
) -> DedicatedScalingBounds:
    top = target_inputs_max(admission)
    return DedicatedScalingBounds(
        target_inputs_max=top,
        buffer_replicas_max=BUFFER_REPLICAS_MAX,
        scale_down_idle_seconds_min=IDLE_MIN,
        scale_down_idle_seconds_max=IDLE_MAX,
        scaledown_window_seconds_min=IDLE_MIN,
        scaledown_window_seconds_max=IDLE_MAX,
        max_queue_depth_max=QUEUE_DEPTH_MAX,
        engine_target_waiting_max=ENGINE_WAITING_MAX,
        queue_signal=model.queue_signal,
        default_profile=model.default_profile or options.default_profile,
        profiles=presets_for(options, top, model.queue_signal),
    )


def default_policy(bounds: DedicatedScalingBounds) -> DedicatedScalingPolicy:
    """What ``scaling`` omitted on create, or ``null`` on PATCH, stores."""
    return bounds.profiles[bounds.default_profile]


def detect_profile(
    policy: DedicatedScalingPolicy, profiles: dict[Profile, DedicatedScalingPolicy]
) -> StateProfile:
    """The preset whose set knobs equal the policy's exactly; ``custom`` when none does."""
    wanted = policy.set_fields()
    for name, preset in profiles.items():
        if preset.set_fields() == wanted:
            return name
    return "custom"


def scaling_state(
    policy: DedicatedScalingPolicy | None, bounds: DedicatedScalingBounds
) -> DedicatedScalingState | None:
    if policy is None:
        return None
    return DedicatedScalingState(
        **policy.set_fields(), profile=detect_profile(policy, bounds.profiles)
    )


def validate_policy(
    policy: DedicatedScalingPolicy, bounds: DedicatedScalingBounds, options: DedicatedOptions
) -> None:
    """The refusals of docs/reference/dedicated.md#errors that depend on the endpoint, not on the
    schema."""
    if policy.target_inputs is not None and policy.target_inputs > bounds.target_inputs_max:
        raise InvalidRequestError(
            f"target_inputs {policy.target_inputs} exceeds this endpoint's admission bound "
            f"({bounds.target_inputs_max}).",
            code="target_inputs_exceeds_admission",
            param="scaling.target_inputs",
        )
    if policy.engine_target_waiting is not None and not bounds.queue_signal:
        raise InvalidRequestError(
            "This model's engine reports no waiting-queue signal; engine_target_waiting "
            "cannot be used.",
            code="queue_signal_unavailable",
            param="scaling.engine_target_waiting",
        )
    if policy.scaledown_window_seconds is not None and not options.scaledown_window_supported:
        raise InvalidRequestError(
            "scaledown_window_seconds needs a newer scheduling backend; use "
            "scale_down_idle_seconds.",
            code="scaling_policy_unsupported",
            param="scaling.scaledown_window_seconds",
        )


@dataclass(frozen=True)
class Replicas:
    """Replica bounds and capacity mode of an endpoint."""

    mode: Mode
    min_replicas: int
    max_replicas: int
    reserved_floor: int


def _knob(policy: DedicatedScalingPolicy, base: DedicatedScalingPolicy, name: str) -> Any:
    value = getattr(policy, name)
    return getattr(base, name) if value is None else value


def autoscaling_options(
    policy: DedicatedScalingPolicy,
    bounds: DedicatedScalingBounds,
    replicas: Replicas,
    options: DedicatedOptions,
) -> dict[str, dict[str, Any]]:
    """Serve deployment options (autoscaling or fixed count, queue bound) per deployment.

    Non-hybrid modes: one ``head`` deployment autoscaled between min and max.
    Hybrid: ``head`` holds exactly ``reserved_floor`` reserved replicas; ``burst``
    autoscales the rest on spot (absent when max_replicas == floor).
    """
    base = default_policy(bounds)
    profile = detect_profile(policy, bounds.profiles)
    preset = options.presets.get(profile if profile != "custom" else bounds.default_profile)
    idle = float(_knob(policy, base, "scale_down_idle_seconds") or 300)
    scaling: dict[str, Any] = {
        "target_ongoing_requests": _knob(policy, base, "target_inputs") or 2,
        "upscale_delay_s": preset.upscale_delay_s if preset else 30.0,
        "downscale_delay_s": idle,
        "downscale_to_zero_delay_s": idle,
    }
    if policy.scaledown_window_seconds is not None:
        scaling["look_back_period_s"] = float(policy.scaledown_window_seconds)
    buffer = int(_knob(policy, base, "buffer_replicas") or 0)
    waiting = _knob(policy, base, "engine_target_waiting") if bounds.queue_signal else None
    if buffer or waiting:
        kwargs = {"buffer_replicas": buffer, "engine_target_waiting": waiting}
        scaling["policy"] = {"policy_function": POLICY_FUNCTION, "policy_kwargs": kwargs}
    depth = _knob(policy, base, "max_queue_depth") or 0
    queue = {"max_queued_requests": depth if depth > 0 else -1}
    if replicas.mode != "hybrid":
        low, high = replicas.min_replicas, replicas.max_replicas
        auto = {**scaling, "min_replicas": low, "initial_replicas": low, "max_replicas": high}
        return {HEAD: {"autoscaling_config": auto, **queue}}
    floor = replicas.reserved_floor
    result: dict[str, dict[str, Any]] = {HEAD: {"num_replicas": floor, **queue}}
    if replicas.max_replicas > floor:
        low = max(0, replicas.min_replicas - floor)
        auto = {
            **scaling,
            "min_replicas": low,
            "initial_replicas": low,
            "max_replicas": replicas.max_replicas - floor,
        }
        result[BURST] = {"autoscaling_config": auto, **queue}
    return result


def check_with_serve(deployments: dict[str, dict[str, Any]]) -> None:
    """400 ``scaling_policy_rejected`` when Ray Serve would refuse the derived config.

    Run before anything is stored, so a refused PATCH leaves the stored policy
    as it was (docs/reference/dedicated.md#errors).
    """
    from ray.serve.config import AutoscalingConfig

    for name, opts in deployments.items():
        auto = opts.get("autoscaling_config")
        if auto is None:
            continue
        try:
            AutoscalingConfig(**auto)
        except (ValueError, TypeError, ImportError) as err:
            raise InvalidRequestError(
                f"The scheduling backend refused this policy for '{name}': {err}",
                code="scaling_policy_rejected",
                param="scaling",
            ) from None
