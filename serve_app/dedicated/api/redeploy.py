"""Billed redeploys: the mode change (with its preview) and the engine change.

The preview and the PUT run the same ordered checks, so ``blocked_reason`` is
exactly the error code the PUT would answer with. A redeploy stores the new
configuration and the one it replaces (``previous``), bumps the deploy
version and marks the change pending; the reconciler replaces the replicas
in place (same app, alias, id and billing rows) and rolls back once to
``previous`` if the new configuration fails to boot.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Literal

from serve_app.auth.principal import ROLE_ADMIN, Principal
from serve_app.dedicated.api.operations import DedicatedService
from serve_app.dedicated.api.views import live_counts
from serve_app.dedicated.offer.engine import validate_engine
from serve_app.dedicated.offer.scaling import detect_profile, validate_policy
from serve_app.dedicated.pricing.rates import (
    burst_class,
    estimated_cost,
    mode_priced,
    rate_per_card_minute,
)
from serve_app.dedicated.store import EndpointRow
from serve_app.protocol.dedicated import (
    DedicatedEndpoint,
    DedicatedEngineChange,
    DedicatedEngineConfig,
    DedicatedModeChange,
    DedicatedModePreview,
    DedicatedModeTarget,
    DedicatedScalingPolicy,
    Mode,
    ModeReload,
    ModeSide,
)
from serve_app.protocol.errors import (
    ConflictError,
    GatewayError,
    InvalidRequestError,
    PermissionDeniedError,
    RateLimitError,
)

Check = Callable[[], GatewayError | None]


def cooldown_remaining(row: EndpointRow, cooldown_s: float, now: datetime) -> int:
    """Seconds until another mode or engine change is allowed (the two share it)."""
    stamps = [t for t in (row.mode_changed_at, row.engine_changed_at) if t is not None]
    if not stamps:
        return 0
    left = cooldown_s - (now - max(stamps)).total_seconds()
    return max(0, math.ceil(left))


def _state_refusal(row: EndpointRow) -> GatewayError | None:
    if row.lifecycle == "paused":
        return ConflictError(
            "A paused endpoint cannot be redeployed; resume it first.", code="endpoint_paused"
        )
    if row.lifecycle == "provisioning" or row.pending is not None:
        return ConflictError(
            "The endpoint is still provisioning or a change is in flight.", code="endpoint_busy"
        )
    if row.lifecycle == "error":
        return ConflictError(
            "The endpoint's last deployment failed; resume or delete it.",
            code="endpoint_not_ready",
        )
    return None


def _first(checks: list[Check]) -> GatewayError | None:
    for check in checks:
        refusal = check()
        if refusal is not None:
            return refusal
    return None


class Redeploys:
    """Mode preview, mode change and engine change for one ``DedicatedService``."""

    def __init__(self, service: DedicatedService) -> None:
        self.service = service
        self.options = service.options

    def _common_checks(self, row: EndpointRow, principal: Principal) -> list[Check]:
        now = self.service.clock()

        def cooldown() -> GatewayError | None:
            left = cooldown_remaining(row, self.options.cooldown_s, now)
            if not left:
                return None
            return RateLimitError(
                f"Mode and engine changes share a cooldown; retry in {left} s.",
                code="mode_change_too_soon",
                headers={"Retry-After": str(left)},
            )

        return [
            lambda: _state_refusal(row),
            cooldown,
            lambda: self.service.check_spending(principal),
        ]

    def _mode_checks(
        self, row: EndpointRow, target: DedicatedModeTarget, principal: Principal
    ) -> list[Check]:
        def admin() -> GatewayError | None:
            if principal.role == ROLE_ADMIN:
                return None
            return PermissionDeniedError(
                "Changing the capacity mode needs the organization role 'admin'.",
                code="insufficient_permissions",
            )

        def eligible() -> GatewayError | None:
            try:
                self.service.offerings.eligible(row.model_id)
            except GatewayError as err:
                return err
            return None

        def target_rules() -> GatewayError | None:
            return self._target_refusal(row, target, principal)

        return [admin, eligible, target_rules, *self._common_checks(row, principal)]

    def _target_refusal(
        self, row: EndpointRow, target: DedicatedModeTarget, principal: Principal
    ) -> GatewayError | None:
        if target.mode == row.mode:
            return InvalidRequestError(
                f"The endpoint already runs in mode '{row.mode}'.", code="mode_unchanged"
            )
        floor = target.reserved_floor or 0
        if target.mode != "hybrid" and floor < 0:
            return InvalidRequestError(
                "reserved_floor must be >= 0 (and applies to hybrid targets only).",
                code="invalid_value",
                param="reserved_floor",
            )
        if target.mode == "hybrid":
            if floor < 1:
                return InvalidRequestError(
                    "A hybrid target needs reserved_floor >= 1.",
                    code="reserved_floor_required",
                    param="reserved_floor",
                )
            cap = self.service.offerings.replica_cap(principal)
            if floor > row.max_replicas or floor > cap:
                return InvalidRequestError(
                    f"reserved_floor {floor} is above max_replicas ({row.max_replicas}) or "
                    f"the cap ({cap}).",
                    code="replica_cap_exceeded",
                    param="reserved_floor",
                )
        if not mode_priced(self.options.rate_card, row.gpu_type, target.mode):
            return InvalidRequestError(
                f"The card '{row.gpu_type}' has no rate for every class mode "
                f"'{target.mode}' bills at.",
                code="mode_not_priced",
            )
        return None

    # ---- preview -------------------------------------------------------------------
    def preview(
        self, endpoint_id: str, target: DedicatedModeTarget, principal: Principal
    ) -> DedicatedModePreview:
        """Read-only quote (docs/reference/dedicated.md#mode-preview): nothing deployed, stored or
        billed."""
        row = self.service.require(endpoint_id, principal)
        refusal = _first(self._mode_checks(row, target, principal))
        floor = (target.reserved_floor or 0) if target.mode == "hybrid" else 0
        live = live_counts(row)
        reloaded = live[1] if live is not None and live[1] > 0 else row.min_replicas
        if target.mode == "hybrid":
            reloaded = max(reloaded, floor)
            reserved, spot = floor, reloaded - floor
        elif target.mode == "reserved":
            reserved, spot = reloaded, 0
        else:
            reserved, spot = 0, reloaded
        card = self.options.rate_card
        rate_res = rate_per_card_minute(card, row.gpu_type, "reserved") or 0.0
        rate_spot = rate_per_card_minute(card, row.gpu_type, "spot") or 0.0
        boot, source = self._boot_estimate(row)
        cost = estimated_cost(row.cards_per_replica, boot, reserved, spot, rate_res, rate_spot)
        now = self.service.clock()
        return DedicatedModePreview(
            endpoint_id=row.id,
            from_=ModeSide(mode=row.mode, reserved_floor=row.reserved_floor),
            to=ModeSide(mode=target.mode, reserved_floor=floor),
            allowed=refusal is None,
            blocked_reason=None if refusal is None else refusal.code,
            reload=ModeReload(
                replicas_reloaded=reloaded,
                replicas_reserved=reserved,
                replicas_spot=spot,
                cards_per_replica=row.cards_per_replica,
                estimated_boot_seconds=boot,
                estimate_source=source,
                rate_per_card_minute=rate_res
                if burst_class(target.mode) == "reserved"
                else rate_spot,
                rate_per_card_minute_reserved=rate_res,
                rate_per_card_minute_spot=rate_spot,
                estimated_cost=cost,
                estimated_cost_usd=cost,
            ),
            unavailable_window_seconds=boot if reloaded > 0 else 0,
            rate_per_card_minute_before=self._burst_rate(row, row.mode),
            rate_per_card_minute_after=self._burst_rate(row, target.mode),
            cooldown_seconds_remaining=cooldown_remaining(row, self.options.cooldown_s, now),
        )

    def _burst_rate(self, row: EndpointRow, mode: Mode) -> float:
        return rate_per_card_minute(self.options.rate_card, row.gpu_type, burst_class(mode)) or 0.0

    def _boot_estimate(self, row: EndpointRow) -> tuple[int, Literal["observed", "default"]]:
        """Last timed start-up of this endpoint (``observed``), else the platform default."""
        events, _ = self.service.store.history(row.id, 50)
        for event in events:
            if event.ready_at is not None:
                seconds = (event.ready_at - event.scaled_up_at).total_seconds()
                return max(1, math.ceil(seconds)), "observed"
        return self.options.default_boot_seconds, "default"

    # ---- the two billed redeploys ------------------------------------------------
    def change_mode(
        self, endpoint_id: str, body: DedicatedModeChange, principal: Principal
    ) -> DedicatedEndpoint:
        row = self.service.require(endpoint_id, principal)
        checks = self._mode_checks(row, body, principal)
        refusal = _first([checks[0], lambda: _confirmation(body.confirm_redeploy), *checks[1:]])
        if refusal is not None:
            raise refusal
        floor = (body.reserved_floor or 0) if body.mode == "hybrid" else 0
        now = self.service.clock()
        updated = self.service.store.update(
            row,
            mode=body.mode,
            reserved_floor=floor,
            previous_mode=row.mode,
            previous=_snapshot(row),
            mode_changed_at=now,
            **_pending(row, "mode", now),
        )
        return self.service.view(updated)

    def change_engine(
        self, endpoint_id: str, body: DedicatedEngineChange, principal: Principal
    ) -> DedicatedEndpoint:
        row = self.service.require(endpoint_id, principal)
        refusal = _confirmation(body.confirm_redeploy)
        if refusal is not None:
            raise refusal
        offering = self.service.offerings.eligible(row.model_id)
        engine = body.engine if body.engine is not None and body.engine.model_dump() else None
        if engine is not None:
            validate_engine(engine, offering.engine)
        if _engine_dump(engine) == _engine_dump(row.engine):
            raise InvalidRequestError(
                "The endpoint already runs these engine settings.", code="engine_unchanged"
            )
        refusal = _first(self._common_checks(row, principal))
        if refusal is not None:
            raise refusal
        policy = self._policy_for_engine(row, engine)
        now = self.service.clock()
        updated = self.service.store.update(
            row,
            engine=engine,
            scaling=policy,
            previous=_snapshot(row),
            engine_changed_at=now,
            **_pending(row, "engine", now),
        )
        return self.service.view(updated)

    def _policy_for_engine(
        self, row: EndpointRow, engine: DedicatedEngineConfig | None
    ) -> DedicatedScalingPolicy | None:
        """A preset follows the new admission bound; a custom policy must fit it (else 400)."""
        if row.scaling is None:
            return None
        offering = self.service.offerings.eligible(row.model_id)
        before = self.service.offerings.bounds(offering, row.engine)
        after = self.service.offerings.bounds(offering, engine)
        profile = detect_profile(row.scaling, before.profiles)
        if profile != "custom":
            return after.profiles[profile]
        validate_policy(row.scaling, after, self.options)
        return row.scaling


def _confirmation(value: object) -> GatewayError | None:
    if value is True:
        return None
    return InvalidRequestError(
        "A redeploy replaces every replica and is billed: send confirm_redeploy: true.",
        code="confirmation_required",
        param="confirm_redeploy",
    )


def _engine_dump(engine: DedicatedEngineConfig | None) -> dict[str, object]:
    return {} if engine is None else dict(engine.model_dump())


def _snapshot(row: EndpointRow) -> dict[str, object]:
    """The configuration a failed redeploy rolls back to: the scaling policy too, since an
    engine change may replace it (a preset follows the new admission bound)."""
    return {
        "mode": row.mode,
        "reserved_floor": row.reserved_floor,
        "engine": None if row.engine is None else row.engine.model_dump(),
        "scaling": None if row.scaling is None else row.scaling.model_dump(),
    }


def _pending(row: EndpointRow, kind: str, now: datetime) -> dict[str, object]:
    return {
        "pending": kind,
        "pending_since": now,
        "rolled_back": False,
        "last_error": None,
        "deploy_version": row.deploy_version + 1,
    }
