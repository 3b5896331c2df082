"""The catalog: lookup by id, visibility per organization, published cards.

The published card is derived from the typed entry so the rules of
docs/reference/models.md#model-card (three names for the context window, spot keys present only when
spot is on, ``supported_parameters`` listing only what the model honours, ``routing`` only
on external models) live in one function rather than in every config file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from serve_app.auth.principal import Principal
from serve_app.catalog.config import (
    AdapterModel,
    CatalogAdapter,
    CatalogModel,
    HeadKind,
    PricingConfig,
)
from serve_app.contract.adapters import AdapterRef, LoraSettings, split_adapter_id
from serve_app.contract.head_kinds import HEAD_KINDS
from serve_app.protocol.errors import InvalidRequestError, PermissionDeniedError, model_not_found
from serve_app.protocol.models import (
    Architecture,
    ModelCard,
    ModelList,
    PoolingInfo,
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

ROUTE_FOR_HEAD: dict[str, str] = {spec.name: spec.route for spec in HEAD_KINDS}
"""Which route serves each head kind, for model_not_supported_for_endpoint."""


def route_for(model: CatalogModel) -> str:
    """The route that serves ``model`` (a score-only pooling model: /v1/rerank)."""
    if model.head == "pooling" and "embedding" not in model.output_modalities:
        return "/v1/rerank"
    return ROUTE_FOR_HEAD[model.head]


def honours_structured_outputs(model: CatalogModel) -> bool:
    """Whether ``response_format``/``structured_outputs`` (``text.format`` on responses)
    get grammar-decoded output from this model.

    The catalog entry decides when it says so: a vLLM head decodes with the grammar
    only once the model's reasoning ends, and a random-weight reasoner never ends it
    (``qwen3-tiny-reasoning-demo``). Unsaid, every own-fleet vLLM head does (vLLM's
    serving layer applies the grammar on any model); other backends do not.
    """
    if model.structured_outputs is not None:
        return model.structured_outputs
    return model.engine.backend == "vllm" and not model.is_external


def supported_parameters(model: CatalogModel) -> list[str]:
    """Only what the chat model honours (docs/reference/models.md#model-card)."""
    params = set(_BASE_CHAT_PARAMETERS)
    if not model.reasoning.separate_channel:
        # refused on separate-channel models (docs/reference/chat.md#chat-request)
        params.add("stop")
    on_vllm = model.engine.backend == "vllm" and not model.is_external
    engine = model.engine.config if on_vllm else {}
    # A vLLM head calls tools only with a tool-call parser (vllm_engine refuses tools
    # without one), so the catalog flag alone does not decide it.
    if model.native_tool_calling and (not on_vllm or engine.get("tool_call_parser")):
        params.update({"tools", "tool_choice", "parallel_tool_calls"})
    if model.reasoning.controllable or model.reasoning.format == "harmony":
        params.add("reasoning_effort")
    if honours_structured_outputs(model):
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
        # Chat models only (the contract's model card): clients tell chat models apart by
        # it; a pooling card says what it takes in ``pooling``.
        supported_parameters=supported_parameters(model) if is_chat else None,
        pooling=_pooling_info(model),
        # docs/reference/common.md#external-models: routing and pricing are never published
        # together.
        pricing=None if model.is_external else _published_prices(model),
        routing=residency_routing(model),
        tier=model.tier,
        notice=model.notice,
        kind=model.kind,
        attribution=model.attribution,
    )


def adapter_card(model: AdapterModel) -> ModelCard:
    """An adapter's entry: its base's card under the adapter's id, ``parent`` naming the
    base (docs/reference/adapters.md#models-list)."""
    card = model_card(model)
    card.parent = model.base_id
    card.owned_by = model.owner_org or model.owned_by
    return card


def lora_settings(model: CatalogModel) -> LoraSettings | None:
    """The ``lora`` settings of an own-fleet chat head that serves adapters, else None."""
    if model.head != "chat" or model.is_external:
        return None
    raw = model.engine.config.get("lora")
    return None if raw is None else LoraSettings.model_validate(raw)


def adapter_pricing(base: PricingConfig, prices: tuple[float, float] | None) -> PricingConfig:
    """The base model's prices, or the adapter's own (input, output) per million tokens."""
    if prices is None:
        return base
    return base.model_copy(update={"input_per_mtok": prices[0], "output_per_mtok": prices[1]})


def _operator_adapter(base: CatalogModel, adapter: CatalogAdapter) -> AdapterModel:
    model_id = f"{base.id}:{adapter.name}"
    ref = AdapterRef(key=f"catalog:{model_id}", model_id=model_id, path=adapter.path)
    own = adapter.pricing
    prices = None if own is None else (own.input_per_mtok, own.output_per_mtok)
    return AdapterModel.of(base, ref, adapter_pricing(base.pricing, prices))


def _pooling_info(model: CatalogModel) -> PoolingInfo | None:
    spec = model.pooling
    if model.head != "pooling" or spec is None:
        return None
    return PoolingInfo(
        dimensions=spec.dimensions,
        matryoshka_dimensions=spec.matryoshka_dimensions,
        score=spec.score,
        truncates=spec.truncates,
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

    def adapter_base(self, model_id: str) -> CatalogModel | None:
        """The chat model that ``<base>:<name>`` would adapt, where it serves adapters."""
        split = split_adapter_id(model_id)
        base = self._models.get(split[0]) if split is not None else None
        return base if base is not None and lora_settings(base) is not None else None

    def operator_adapter(self, model_id: str) -> AdapterModel | None:
        """An adapter the catalog declares (visible to every organization), or None."""
        base = self.adapter_base(model_id)
        name = model_id.rpartition(":")[2]
        for adapter in base.adapters if base is not None else ():
            if adapter.name == name:
                return _operator_adapter(base, adapter)  # type: ignore[arg-type]
        return None

    def operator_adapters(self) -> list[AdapterModel]:
        return [_operator_adapter(m, a) for m in self._models.values() for a in m.adapters]

    def visible_to(self, principal: Principal) -> list[CatalogModel]:
        """External models are listed only to organizations that enabled them."""
        return [
            m
            for m in self._models.values()
            if not m.is_external or principal.external_providers_enabled
        ]

    def model_list(self, principal: Principal) -> ModelList:
        """The caller's models, then the catalog's adapters (the org's own are added by
        ``AdapterService.cards``)."""
        cards = [model_card(m) for m in self.visible_to(principal)]
        cards.extend(adapter_card(a) for a in self.operator_adapters())
        return ModelList(data=cards)

    def card_for(self, model_id: str, principal: Principal) -> ModelCard | None:
        """The card of one listed model, or None where ``model_list`` would not show it."""
        model = self.get(model_id)
        if model is None and (adapter := self.operator_adapter(model_id)) is not None:
            return adapter_card(adapter)
        if model is None or (model.is_external and not principal.external_providers_enabled):
            return None
        return model_card(model)

    def resolve(self, model_id: str, principal: Principal, head: HeadKind) -> CatalogModel:
        """The model a request may use on a route of ``head`` kind, or the API's error.

        Order matters: 404 for unknown ids, then 403 for external models of an
        organization without the flag (before rate limiting, docs/reference/chat.md#chat-request),
        then 400 when another route serves the model.
        """
        model = self.get(model_id) or self.operator_adapter(model_id)
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
                f"The model '{model.id}' is not a {head} model; use {route_for(model)}.",
                code="model_not_supported_for_endpoint",
                param="model",
            )
        return model


def _strip_spot_suffix(model_id: str) -> str:
    """The legacy ``:spot`` suffix is accepted and has no effect
    (docs/reference/common.md#versioning)."""
    return model_id[: -len(":spot")] if model_id.endswith(":spot") else model_id
