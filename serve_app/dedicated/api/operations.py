"""The ``/api/dedicated`` operations that store desired state (the reconciler applies it).

Every call validates against the API's rules, writes the new desired state
in one statement, and returns at once: provisioning, redeploys, pauses and
deletes are carried out by ``control.reconciler.Reconciler``
(docs/reference/dedicated.md: "provisioning is asynchronous"). Mode and engine
changes live in ``api.redeploy``. All methods are blocking (database); routes
run them in a thread.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from serve_app.auth.principal import Principal
from serve_app.dedicated.alias import alias_for
from serve_app.dedicated.api.views import endpoint_view, spans
from serve_app.dedicated.offer.catalog import Offering, Offerings, app_spec
from serve_app.dedicated.offer.engine import validate_engine
from serve_app.dedicated.offer.scaling import check_with_serve, default_policy, validate_policy
from serve_app.dedicated.options import DedicatedOptions
from serve_app.dedicated.pricing.rates import (
    RateHistory,
    mode_priced,
    month_start,
    month_usage,
    rate_card_view,
)
from serve_app.dedicated.store import DedicatedStore, EndpointRow, ReplicaEvent
from serve_app.protocol.dedicated import (
    DedicatedCreateRequest,
    DedicatedEndpoint,
    DedicatedEngineConfig,
    DedicatedPatchRequest,
    DedicatedRateCard,
    DedicatedScalingPolicy,
    Mode,
)
from serve_app.protocol.errors import (
    ConflictError,
    GatewayError,
    InvalidRequestError,
    NotFoundError,
)
from serve_app.storage.schema import utcnow

logger = logging.getLogger(__name__)


class PaymentRequiredError(GatewayError):
    """402: the organization's monthly spending cap is reached."""

    status_code = 402
    error_type = "invalid_request_error"
    default_code = "spending_cap_reached"


def check_replicas(
    mode: Mode, min_replicas: int, max_replicas: int, floor: int | None, cap: int
) -> int:
    """Bounds and floor against the org cap (docs/reference/dedicated.md); returns the floor to
    store."""
    for name, value in (("max_replicas", max_replicas), ("min_replicas", min_replicas)):
        if value > cap:
            raise InvalidRequestError(
                f"{name} {value} is above your organization's cap of {cap} replicas.",
                code="replica_cap_exceeded",
                param=name,
            )
    if min_replicas > max_replicas:
        raise InvalidRequestError(
            "min_replicas must not exceed max_replicas.", code="invalid_value", param="min_replicas"
        )
    if mode != "hybrid":
        if floor:  # any value but 0 (negative ones included) asks for a floor
            raise InvalidRequestError(
                "reserved_floor applies to hybrid endpoints only.",
                code="invalid_value",
                param="reserved_floor",
            )
        return 0
    if floor is None or floor < 1:
        raise InvalidRequestError(
            "A hybrid endpoint needs reserved_floor >= 1.",
            code="reserved_floor_required",
            param="reserved_floor",
        )
    if floor > max_replicas or floor > cap:
        raise InvalidRequestError(
            f"reserved_floor {floor} is above max_replicas ({max_replicas}) or the cap ({cap}).",
            code="replica_cap_exceeded",
            param="reserved_floor",
        )
    return floor


class DedicatedService:
    """Validates and stores; reads records with this month's billing."""

    def __init__(
        self,
        store: DedicatedStore,
        offerings: Offerings,
        options: DedicatedOptions,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.offerings = offerings
        self.options = options
        self.clock = clock

    # ---- reads ---------------------------------------------------------------
    def require(self, endpoint_id: str, principal: Principal) -> EndpointRow:
        """The caller's (non-deleted) endpoint, else 404 (docs/reference/dedicated.md#errors)."""
        row = self.store.get(endpoint_id)
        if row is None or row.org_id != principal.org_id or row.lifecycle == "deleted":
            raise NotFoundError(
                f"No dedicated endpoint '{endpoint_id}'.", code="endpoint_not_found"
            )
        return row

    def views(self, rows: Sequence[EndpointRow]) -> list[DedicatedEndpoint]:
        now = self.clock()
        events = self.store.events_since([r.id for r in rows], month_start(now))
        by_endpoint: dict[str, list[ReplicaEvent]] = {r.id: [] for r in rows}
        for event in events:
            by_endpoint[event.endpoint_id].append(event)
        card = self.rate_history(now)
        return [
            endpoint_view(
                row,
                self.offerings,
                self.offerings.get(row.model_id),
                month_usage(spans(by_endpoint[row.id]), card, now),
                by_endpoint[row.id],
            )
            for row in rows
        ]

    def rate_history(self, now: datetime) -> RateHistory:
        """The cards minutes are priced at; records the configured one when it is new."""
        return self.store.rate_card_history(self.options.rate_card, now)

    def view(self, row: EndpointRow) -> DedicatedEndpoint:
        return self.views([row])[0]

    def list(self, principal: Principal) -> list[DedicatedEndpoint]:
        return self.views(self.store.list_org(principal.org_id))

    def get(self, endpoint_id: str, principal: Principal) -> DedicatedEndpoint:
        return self.view(self.require(endpoint_id, principal))

    def rates(self, principal: Principal) -> DedicatedRateCard:
        return rate_card_view(self.options.rate_card, self.offerings.replica_cap(principal))

    def org_month_cost(self, org_id: str) -> float:
        now = self.clock()
        events = self.store.events_since(self.store.org_endpoint_ids(org_id), month_start(now))
        return month_usage(spans(events), self.rate_history(now), now).cost

    def check_spending(self, principal: Principal) -> PaymentRequiredError | None:
        cap = self.options.monthly_spend_cap
        if cap is None:
            return None
        spent = self.org_month_cost(principal.org_id)
        if spent < cap:
            return None
        return PaymentRequiredError(
            f"Your organization reached its monthly dedicated spending cap "
            f"({spent:.2f} of {cap:.2f} {self.options.rate_card.currency})."
        )

    # ---- policy checks shared by create and patch -----------------------------
    def _checked_policy(
        self,
        offering: Offering,
        engine: DedicatedEngineConfig | None,
        policy: DedicatedScalingPolicy | None,
        draft: EndpointRow,
    ) -> DedicatedScalingPolicy:
        bounds = self.offerings.bounds(offering, engine)
        chosen = policy if policy is not None and policy.set_fields() else default_policy(bounds)
        validate_policy(chosen, bounds, self.options)
        candidate = replace(draft, scaling=chosen, engine=engine)
        spec = app_spec(candidate, offering, self.options)
        check_with_serve({d.name: d.options for d in spec.deployments})
        return chosen

    # ---- writes ------------------------------------------------------------------
    def create(self, body: DedicatedCreateRequest, principal: Principal) -> DedicatedEndpoint:
        offering = self.offerings.eligible(body.model_id)
        cap = self.offerings.replica_cap(principal)
        floor = check_replicas(
            body.mode, body.min_replicas, body.max_replicas, body.reserved_floor, cap
        )
        if not mode_priced(self.options.rate_card, offering.gpu_type, body.mode):
            raise _not_priced(body.mode, offering.gpu_type)
        if body.engine is not None:
            validate_engine(body.engine, offering.engine)
        now = self.clock()
        draft = EndpointRow(
            id=f"ded_{secrets.token_hex(12)}",
            org_id=principal.org_id,
            created_by=principal.user_id,
            model_id=body.model_id,
            slug=body.alias_slug,
            alias=alias_for(body.alias_slug),
            mode=body.mode,
            lifecycle="provisioning",
            gpu_type=offering.gpu_type,
            min_replicas=body.min_replicas,
            max_replicas=body.max_replicas,
            reserved_floor=floor,
            cards_per_replica=offering.cards_per_replica,
            revision=0,
            deploy_version=1,
            rolled_back=False,
            pending="provision",
            scaling=None,
            engine=body.engine if body.engine and body.engine.model_dump() else None,
            previous=None,
            previous_mode=None,
            deployed_hash=None,
            live=None,
            last_error=None,
            block_tokens=None,
            created_at=now,
            pending_since=now,
        )
        policy = self._checked_policy(offering, draft.engine, body.scaling, draft)
        row = self.store.create(replace(draft, scaling=policy), self.options.org_endpoint_quota)
        logger.info("dedicated endpoint %s (%s) created for org %s", row.id, row.alias, row.org_id)
        return self.view(row)

    def patch(
        self, endpoint_id: str, body: DedicatedPatchRequest, principal: Principal
    ) -> DedicatedEndpoint:
        row = self.require(endpoint_id, principal)
        given = body.model_fields_set
        if "mode" in given:
            raise InvalidRequestError(
                "Changing the capacity mode is a billed redeploy: use "
                "PUT /api/dedicated/{endpoint_id}/mode.",
                code="mode_change_requires_redeploy",
                param="mode",
            )
        if "scaling" in given and body.scaling is not None and not body.scaling.set_fields():
            raise InvalidRequestError(
                "scaling must name at least one field, or be null for the default preset.",
                code="invalid_value",
                param="scaling",
            )
        if body.reserved_floor is not None and row.mode != "hybrid":
            raise InvalidRequestError(
                "reserved_floor applies to hybrid endpoints only.",
                code="invalid_value",
                param="reserved_floor",
            )
        offering = self.offerings.eligible(row.model_id)
        low = row.min_replicas if body.min_replicas is None else body.min_replicas
        high = row.max_replicas if body.max_replicas is None else body.max_replicas
        floor = row.reserved_floor if body.reserved_floor is None else body.reserved_floor
        floor = check_replicas(row.mode, low, high, floor, self.offerings.replica_cap(principal))
        policy = body.scaling if "scaling" in given else row.scaling
        draft = replace(row, min_replicas=low, max_replicas=high, reserved_floor=floor)
        policy = self._checked_policy(offering, row.engine, policy, draft)
        updated = self.store.update(
            row, min_replicas=low, max_replicas=high, reserved_floor=floor, scaling=policy
        )
        return self.view(updated)

    def delete(self, endpoint_id: str, principal: Principal) -> DedicatedEndpoint:
        row = self.require(endpoint_id, principal)
        # ``live`` is null from now on (docs/reference/dedicated.md#endpoint: nothing is meant to be
        # deployed); the replicas still stopping keep billing until the meter sees them gone.
        updated = self.store.update(
            row,
            lifecycle="deleted",
            deleted_at=self.clock(),
            pending=None,
            pending_since=None,
            live=None,
        )
        logger.info("dedicated endpoint %s deleted", row.id)
        return self.view(updated)

    def pause(self, endpoint_id: str, principal: Principal) -> DedicatedEndpoint:
        row = self.require(endpoint_id, principal)
        if row.lifecycle == "paused":
            return self.view(row)
        updated = self.store.update(
            row, lifecycle="paused", pending=None, pending_since=None, live=None
        )
        return self.view(updated)

    def resume(self, endpoint_id: str, principal: Principal) -> DedicatedEndpoint:
        row = self.require(endpoint_id, principal)
        if row.lifecycle not in ("paused", "error"):
            raise ConflictError(
                "Only a paused (or failed) endpoint can be resumed.", code="endpoint_not_paused"
            )
        refusal = self.check_spending(principal)
        if refusal is not None:
            raise refusal
        now = self.clock()
        updated = self.store.update(
            row,
            lifecycle="active",
            pending="resume",
            pending_since=now,
            rolled_back=False,
            last_error=None,
            deploy_version=row.deploy_version + 1,
            live=None,  # warming until the reconciler observes the resumed app
        )
        return self.view(updated)


def _not_priced(mode: Mode, gpu_type: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"The card '{gpu_type}' has no rate for every class mode '{mode}' bills at.",
        code="mode_not_priced",
        param="mode",
    )
