"""What the catalog offers for dedicated use, and the Serve app an endpoint becomes.

``Offerings`` joins a catalog entry with its ``dedicated.models`` options
(card, cards per replica, engine offer). ``app_spec`` turns a stored endpoint
into the ``AppSpec`` the reconciler deploys: the cloned model's head kind (chat,
or pooling for embedding and scoring models) and engine with the endpoint's
settings, autoscaling from the stored policy, and the capacity class as a Ray
custom resource so replicas land on nodes of the class they are billed at.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from serve_app.auth.principal import Principal
from serve_app.catalog.config import CatalogModel
from serve_app.contract.head_kinds import HEAD_KINDS
from serve_app.dedicated.alias import app_name_for
from serve_app.dedicated.control.backend import AppSpec, DeploymentSpec
from serve_app.dedicated.offer.engine import (
    EngineOffer,
    admission_bound,
    engine_config_for,
)
from serve_app.dedicated.offer.pooling import offer_for
from serve_app.dedicated.offer.scaling import (
    BURST,
    HEAD,
    Replicas,
    autoscaling_options,
    default_policy,
    scaling_bounds,
)
from serve_app.dedicated.options import CapacityClass, DedicatedModelOptions, DedicatedOptions
from serve_app.dedicated.store import EndpointRow
from serve_app.protocol.dedicated import DedicatedEngineConfig, DedicatedScalingBounds
from serve_app.protocol.errors import InvalidRequestError

DEDICATED_HEADS = frozenset(spec.name for spec in HEAD_KINDS if spec.dedicated)
"""Head kinds a dedicated endpoint can clone (the table's ``dedicated``): chat models, and
pooling (embedding and scoring) models, served by the pooling head in the endpoint's own
app."""


@dataclass(frozen=True)
class Offering:
    """One catalog model as a dedicated endpoint can clone it."""

    model: CatalogModel
    options: DedicatedModelOptions
    engine: EngineOffer
    gpu_type: str
    cards_per_replica: int


class Offerings:
    """Catalog entries + ``dedicated`` options: eligibility, bounds, caps.

    It reads the configured entries, not the ``Catalog`` service: the catalog resolves
    dedicated aliases through this subsystem's router, which is built first.
    """

    def __init__(self, models: Iterable[CatalogModel], options: DedicatedOptions) -> None:
        self.models = {model.id: model for model in models}
        self.options = options

    def get(self, model_id: str) -> Offering | None:
        """The offer of a catalog model; None when the model left the catalog."""
        model = self.models.get(model_id)
        if model is None:
            return None
        opts = self.options.model_options(model_id)
        tp = model.engine.config.get("tensor_parallel_size")
        cards = opts.cards_per_replica or (tp if isinstance(tp, int) and tp > 0 else 1)
        return Offering(
            model=model,
            options=opts,
            engine=offer_for(model, opts),
            gpu_type=opts.gpu_type or self.options.default_gpu_type,
            cards_per_replica=cards,
        )

    def is_eligible(self, model_id: str) -> bool:
        model = self.models.get(model_id)
        return (
            model is not None
            and model.head in DEDICATED_HEADS
            and not model.is_external
            and model.dedicated_eligible
            and model_id not in self.options.ineligible_models
        )

    def eligible(self, model_id: str) -> Offering:
        """The offer, or 400 ``model_not_eligible``."""
        offering = self.get(model_id) if self.is_eligible(model_id) else None
        if offering is None:
            raise InvalidRequestError(
                f"The model '{model_id}' is not an active catalog model eligible for "
                "dedicated endpoints.",
                code="model_not_eligible",
                param="model_id",
            )
        return offering

    def bounds(
        self, offering: Offering, engine: DedicatedEngineConfig | None
    ) -> DedicatedScalingBounds:
        return scaling_bounds(
            self.options, offering.options, admission_bound(engine, offering.engine)
        )

    def replica_cap(self, principal: Principal) -> int:
        """docs/reference/dedicated.md#limits: 16 by default, 32 for an internal organization."""
        if principal.org_internal:
            return self.options.replica_cap_internal
        return self.options.replica_cap


def _actor_options(
    offering: Offering, cls: CapacityClass, options: DedicatedOptions
) -> dict[str, Any]:
    base = dict(offering.options.ray_actor_options or offering.model.deployment.ray_actor_options)
    resources = {
        k: v
        for k, v in dict(base.get("resources") or {}).items()
        if k not in options.capacity_resources.values()
    }
    resources[options.capacity_resources[cls]] = options.capacity_resource_amount
    return {**base, "resources": resources}


def _code_version(backend: str, engine_config: dict[str, Any]) -> str:
    """Serve restarts replicas only when this (or the actor options) changes."""
    raw = json.dumps([backend, engine_config], sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def app_spec(row: EndpointRow, offering: Offering, options: DedicatedOptions) -> AppSpec:
    """The Serve application ``row`` should be running now."""
    engine_config = engine_config_for(row.engine, offering.engine)
    bounds = scaling_bounds(options, offering.options, admission_bound(row.engine, offering.engine))
    policy = row.scaling or default_policy(bounds)
    per_deployment = autoscaling_options(
        policy,
        bounds,
        Replicas(row.mode, row.min_replicas, row.max_replicas, row.reserved_floor),
        options,
    )
    spec = offering.model.deployment
    common = {
        "version": _code_version(offering.model.engine.backend, engine_config),
        "max_ongoing_requests": admission_bound(row.engine, offering.engine),
        "health_check_period_s": spec.health_check_period_s,
        "health_check_timeout_s": spec.health_check_timeout_s,
        "max_constructor_retry_count": options.max_constructor_retry_count,
    }
    deployments = []
    for name, serve_options in per_deployment.items():
        cls: CapacityClass = "spot" if name == BURST or row.mode == "spot" else "reserved"
        if name == HEAD and row.mode == "hybrid":
            cls = "reserved"
        opts = {
            **common,
            **serve_options,
            "name": name,
            "ray_actor_options": _actor_options(offering, cls, options),
        }
        deployments.append(DeploymentSpec(name=name, capacity_class=cls, options=opts))
    return AppSpec(
        name=app_name_for(row.slug),
        model_id=row.alias,
        head=offering.model.head,
        backend=offering.model.engine.backend,
        engine_config=engine_config,
        deployments=tuple(deployments),
    )
