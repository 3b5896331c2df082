"""The catalog: lookup by id, visibility per organization, published cards.

The published card is derived from the typed entry so the rules of spec 2.2
(three names for the context window, spot keys present only when spot is on,
``supported_parameters`` listing only what the model honours, ``routing`` only
on external models) live in one function rather than in every config file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from serve_app.auth.principal import Principal
from serve_app.catalog.config import CatalogModel, HeadKind
from serve_app.protocol.errors import InvalidRequestError, PermissionDeniedError, model_not_found
from serve_app.protocol.models import (
    Architecture,
    ModelCard,
    ModelList,
    ReasoningInfo,
    ResidencyRouting,
)

# Parameters every own-fleet chat model honours through the engine.
_BASE_CHAT_PARAMETERS = (
    "frequency_penalty",
    "max_completion_tokens",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
)

# Which route serves each head kind, for model_not_supported_for_endpoint.
ROUTE_FOR_HEAD: dict[HeadKind, str] = {
    "chat": "/v1/chat/completions",
    "speech": "/v1/audio/speech",
    "transcription": "/v1/audio/transcriptions",
    "video": "/v1/video/generations",
    "detect": "/v1/detect",
    "parse": "/v1/parse",
}


def supported_parameters(model: CatalogModel) -> list[str]:
    """Only what the model honours (spec 2.2)."""
    params = set(_BASE_CHAT_PARAMETERS)
    if not model.reasoning.separate_channel:
        params.add("stop")  # refused on separate-channel models (spec 4.1)
    on_vllm = model.engine.backend == "vllm" and not model.is_external
    engine = model.engine.config if on_vllm else {}
    # A vLLM head calls tools only with a tool-call parser (vllm_engine refuses tools
    # without one), so the catalog flag alone does not decide it.
    if model.native_tool_calling and (not on_vllm or engine.get("tool_call_parser")):
        params.update({"tools", "tool_choice", "parallel_tool_calls"})
    if model.reasoning.controllable or model.reasoning.format == "harmony":
        params.add("reasoning_effort")
    if model.structured_outputs or on_vllm:
        # vLLM's serving layer decodes json_object/json_schema with a grammar on every model.
        params.update({"response_format", "structured_outputs"})
    if on_vllm:
        params.update({"logprobs", "top_logprobs"})
    return sorted(params)


def residency_routing(model: CatalogModel) -> ResidencyRouting | None:
    if model.external is None:
        return None
    return ResidencyRouting(notice=model.external.notice, region=model.external.region)


def model_card(model: CatalogModel) -> ModelCard:
    """The published entry of one model."""
    pricing = model.pricing
    spot = pricing.mode == "spot" and not model.is_external
    is_chat = model.head == "chat"
    window = model.context_length
    return ModelCard(
        id=model.id,
        owned_by=model.owned_by,
        created=model.created,
        architecture=Architecture(
            input_modalities=list(model.input_modalities),
            output_modalities=list(model.output_modalities),
        ),
        context_length=window,
        context_window=window,
        max_model_len=window,
        max_output_tokens=model.max_output_tokens,
        pricing_mode=pricing.mode,
        spot_enabled=spot,
        spot_multiplier=pricing.spot_multiplier if spot else None,
        gpu_class=pricing.gpu_class if spot else None,
        publisher=model.publisher,
        release_date=model.release_date,
        specialties=list(model.specialties) or None,
        reasoning=(
            ReasoningInfo(
                controllable=model.reasoning.controllable,
                separate_channel=model.reasoning.separate_channel,
            )
            if is_chat
            else None
        ),
        supported_parameters=supported_parameters(model) if is_chat else None,
        # Spec 2.3: routing and pricing are never published together.
        pricing=None if model.is_external else _published_prices(model),
        routing=residency_routing(model),
        tier=model.tier,
        notice=model.notice,
        kind=model.kind,
        attribution=model.attribution,
    )


def _published_prices(model: CatalogModel) -> dict[str, float | str]:
    fields = model.pricing.model_dump(
        exclude={"mode", "spot_multiplier", "gpu_class"}, exclude_none=True
    )
    return {k: v for k, v in fields.items() if isinstance(v, (int, float, str))}


AliasResolver = Callable[[str, Principal], CatalogModel | None]
"""Resolves an id the catalog does not list (``ded/<slug>`` dedicated aliases) for a caller."""


class Catalog:
    """Immutable set of models, built once per gateway replica from the config."""

    def __init__(
        self, models: Iterable[CatalogModel], alias_resolver: AliasResolver | None = None
    ) -> None:
        """``alias_resolver``: where ids it does not list are looked up (dedicated aliases;
        the composition root builds dedicated routing first and passes its resolver)."""
        self.alias_resolver = alias_resolver
        self._models: dict[str, CatalogModel] = {}
        for model in models:
            if model.id in self._models:
                raise ValueError(f"duplicate catalog id {model.id!r}")
            self._models[model.id] = model

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)

    def get(self, model_id: str) -> CatalogModel | None:
        return self._models.get(_strip_spot_suffix(model_id))

    def visible_to(self, principal: Principal) -> list[CatalogModel]:
        """External models are listed only to organizations that enabled them."""
        return [
            m
            for m in self._models.values()
            if not m.is_external or principal.external_providers_enabled
        ]

    def model_list(self, principal: Principal) -> ModelList:
        return ModelList(data=[model_card(m) for m in self.visible_to(principal)])

    def card_for(self, model_id: str, principal: Principal) -> ModelCard | None:
        """The card of one listed model, or None where ``model_list`` would not show it."""
        model = self.get(model_id)
        if model is None or (model.is_external and not principal.external_providers_enabled):
            return None
        return model_card(model)

    def resolve(self, model_id: str, principal: Principal, head: HeadKind) -> CatalogModel:
        """The model a request may use on a route of ``head`` kind, or the spec's error.

        Order matters: 404 for unknown ids, then 403 for external models of an
        organization without the flag (before rate limiting, spec 4.1), then
        400 when another route serves the model.
        """
        model = self.get(model_id)
        if model is None and self.alias_resolver is not None:
            model = self.alias_resolver(model_id, principal)
        if model is None:
            raise model_not_found(model_id)
        if model.is_external and not principal.external_providers_enabled:
            raise PermissionDeniedError(
                f"The model '{model.id}' is served by an external provider, which your "
                "organization has not enabled.",
                code="external_provider_not_enabled",
                param="model",
            )
        if model.head != head:
            raise InvalidRequestError(
                f"The model '{model.id}' is not a {head} model; use {ROUTE_FOR_HEAD[model.head]}.",
                code="model_not_supported_for_endpoint",
                param="model",
            )
        return model


def _strip_spot_suffix(model_id: str) -> str:
    """The legacy ``:spot`` suffix is accepted and has no effect (spec 9)."""
    return model_id[: -len(":spot")] if model_id.endswith(":spot") else model_id
