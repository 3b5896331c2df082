"""Which engine settings a model offers a dedicated endpoint, and what they become.

The catalog entry's engine (backend + config) is the recipe; an endpoint's
``DedicatedEngineConfig`` replaces the defaults it names. vLLM honours all four
settings; another backend (a scripted test engine, a custom ``module:Class``)
honours only those its ``offered_settings`` declare, so a setting that would be
silently ignored is refused (``engine_setting_unavailable``) instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from serve_app.catalog.config import CatalogModel
from serve_app.dedicated.options import DedicatedModelOptions, EngineSettingName
from serve_app.protocol.dedicated import (
    DedicatedEngineBounds,
    DedicatedEngineConfig,
    DedicatedEngineSetting,
)
from serve_app.protocol.errors import InvalidRequestError

MIN_MODEL_LEN = 1024
VLLM_DEFAULT_MAX_NUM_SEQS = 4  # VLLMEngineConfig's default


@dataclass(frozen=True)
class EngineOffer:
    """A model's recipe plus the bounds of what an endpoint may change."""

    backend: str
    base_config: dict[str, Any]
    bounds: DedicatedEngineBounds
    model_bound: int
    speculative_method: str

    @property
    def is_vllm(self) -> bool:
        return self.backend == "vllm"


def _ignored(name: EngineSettingName, default: Any) -> DedicatedEngineSetting:
    return DedicatedEngineSetting(
        available=False,
        reason="script_ignores_setting",
        default=default,
        choices=[0] if name == "speculative_tokens" else None,
    )


def _max_model_len(config: dict[str, Any], model: CatalogModel) -> DedicatedEngineSetting:
    top = config.get("max_model_len") or model.context_length
    if top is None or top < MIN_MODEL_LEN:
        return DedicatedEngineSetting(available=False, reason="default_unknown", default=top)
    return DedicatedEngineSetting(
        available=True, reason=None, default=top, min=MIN_MODEL_LEN, max=top
    )


def max_num_seqs_setting(config: dict[str, Any], vllm: bool, top: int) -> DedicatedEngineSetting:
    """``max_num_seqs`` up to ``top``; its default is the config's, else vLLM's own."""
    default = config.get("max_num_seqs") or (VLLM_DEFAULT_MAX_NUM_SEQS if vllm else None)
    reason = None if default is not None else "default_unknown"
    return DedicatedEngineSetting(available=True, reason=reason, default=default, min=1, max=top)


def _prefix_caching(
    config: dict[str, Any], options: DedicatedModelOptions
) -> DedicatedEngineSetting:
    default = config.get("enable_prefix_caching")
    if options.prefix_cache == "locked_off":
        return DedicatedEngineSetting(
            available=False, reason="prefix_cache_locked_off", default=False
        )
    if options.prefix_cache == "inert":
        return DedicatedEngineSetting(available=False, reason="prefix_cache_inert", default=default)
    reason = None if default is not None else "default_unknown"
    return DedicatedEngineSetting(available=True, reason=reason, default=default)


def _speculative(options: DedicatedModelOptions) -> DedicatedEngineSetting:
    depths = sorted({d for d in options.speculative_depths if d > 0})
    if not depths:
        return DedicatedEngineSetting(
            available=False, reason="no_mtp_head", default=0, min=0, max=0, choices=[0]
        )
    return DedicatedEngineSetting(
        available=True, reason=None, default=0, min=0, max=depths[-1], choices=[0, *depths]
    )


def engine_offer(model: CatalogModel, options: DedicatedModelOptions) -> EngineOffer:
    """The offer of one catalog model (what ``engine_bounds`` publishes)."""
    config = dict(model.engine.config)
    vllm = model.engine.backend == "vllm"
    model_bound = options.admission_bound or model.deployment.max_ongoing_requests
    settings: dict[EngineSettingName, DedicatedEngineSetting] = {
        "max_model_len": _max_model_len(config, model),
        "max_num_seqs": max_num_seqs_setting(
            config, vllm, options.max_concurrent_inputs or model_bound
        ),
        "prefix_caching": _prefix_caching(config, options),
        "speculative_tokens": _speculative(options),
    }
    return offer_of(model, options, config, model_bound, settings, list(settings))


def offer_of(
    model: CatalogModel,
    options: DedicatedModelOptions,
    config: dict[str, Any],
    model_bound: int,
    settings: dict[EngineSettingName, DedicatedEngineSetting],
    declarable: Iterable[EngineSettingName],
) -> EngineOffer:
    """The offer of ``settings``, shared by chat and pooling models.

    vLLM honours every setting. Another backend may silently ignore one, so each of the
    ``declarable`` settings its ``offered_settings`` does not declare is marked
    ``script_ignores_setting`` and refused; the others keep what ``settings`` says.
    """
    if model.engine.backend != "vllm":
        offered = set(options.offered_settings or [])
        for name in declarable:
            if name not in offered:
                settings[name] = _ignored(name, settings[name].default)
    return EngineOffer(
        backend=model.engine.backend,
        base_config=config,
        bounds=DedicatedEngineBounds(**settings),
        model_bound=model_bound,
        speculative_method=options.speculative_method,
    )


def unknown_model_bounds() -> DedicatedEngineBounds:
    """Bounds of an endpoint whose model left the catalog: nothing can be changed."""
    off = DedicatedEngineSetting(available=False, reason="model_unknown", default=None)
    spec = DedicatedEngineSetting(
        available=False, reason="model_unknown", default=None, choices=[0]
    )
    return DedicatedEngineBounds(
        max_model_len=off, max_num_seqs=off, prefix_caching=off, speculative_tokens=spec
    )


def validate_engine(engine: DedicatedEngineConfig, offer: EngineOffer) -> None:
    """400 for a setting the model does not offer, or a value outside its bounds."""
    for name, value in engine.model_dump().items():
        setting: DedicatedEngineSetting = getattr(offer.bounds, name)
        param = f"engine.{name}"
        if not setting.available:
            raise InvalidRequestError(
                f"'{name}' is not offered for this model ({setting.reason}).",
                code="engine_setting_unavailable",
                param=param,
            )
        if isinstance(value, bool):
            continue
        if setting.choices is not None and value not in setting.choices:
            raise InvalidRequestError(
                f"'{name}' must be one of {setting.choices}.", code="invalid_value", param=param
            )
        low, high = setting.min, setting.max
        if (low is not None and value < low) or (high is not None and value > high):
            raise InvalidRequestError(
                f"'{name}' must be between {low} and {high}.", code="invalid_value", param=param
            )


def effective_max_num_seqs(engine: DedicatedEngineConfig | None, offer: EngineOffer) -> int | None:
    if engine is not None and engine.max_num_seqs is not None:
        return engine.max_num_seqs
    default = offer.bounds.max_num_seqs.default
    return default if isinstance(default, int) and not isinstance(default, bool) else None


def admission_bound(engine: DedicatedEngineConfig | None, offer: EngineOffer) -> int:
    """min(2 x max_num_seqs, the model's bound): what one replica admits at once."""
    seqs = effective_max_num_seqs(engine, offer)
    return offer.model_bound if seqs is None else min(2 * seqs, offer.model_bound)


def engine_config_for(engine: DedicatedEngineConfig | None, offer: EngineOffer) -> dict[str, Any]:
    """The backend config a replica starts with: the recipe, overridden by ``engine``."""
    config = dict(offer.base_config)
    if engine is None:
        return config
    if engine.max_model_len is not None:
        config["max_model_len"] = engine.max_model_len
    if engine.max_num_seqs is not None:
        config["max_num_seqs"] = engine.max_num_seqs
    if engine.prefix_caching is not None:
        config["enable_prefix_caching"] = engine.prefix_caching
    if engine.speculative_tokens is not None:
        if offer.is_vllm:
            args = dict(config.get("engine_args") or {})
            args.pop("speculative_config", None)
            if engine.speculative_tokens:
                args["speculative_config"] = {
                    "method": offer.speculative_method,
                    "num_speculative_tokens": engine.speculative_tokens,
                }
            config["engine_args"] = args
        else:
            config["speculative_tokens"] = engine.speculative_tokens
    return config
