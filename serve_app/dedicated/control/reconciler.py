"""The one loop that converges Ray Serve to the stored dedicated endpoints.

Runs in every gateway replica; a lease row in the database makes it single
flight (the holder renews it each period; another replica takes over when it
expires, e.g. after the holder died). Each period it reads Serve's state once
and, per endpoint:

- deploys the app when it is missing or its spec changed (``serve.run`` of that
  one app: a policy change is a lightweight in-place update, a mode or engine
  change replaces the replicas because their actor options or code version
  changed), and deletes the app of a paused, failed or deleted endpoint;
- moves a pending change on: done when a replica started after the change is
  running (or nothing needs to run); on a failed or timed-out boot it rolls a
  mode/engine change back once to the previous configuration, else ``error``;
- writes the live replica counts every replica presents to callers;
- records replica lifetimes for billing (``pricing.meter.ReplicaMeter``).

It only ever deletes ``ded-*`` applications, and only those no stored endpoint
wants, so the ops config's apps (``gateway``) are never touched; a new
reconciler (gateway restart) finds the stored fingerprints equal to what runs
and adopts the running apps without redeploying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from datetime import datetime, timedelta
from typing import Any

from serve_app.background import PeriodicLoop
from serve_app.dedicated.alias import app_name_for, is_dedicated_app
from serve_app.dedicated.context import BuiltOnContext, DedicatedContext
from serve_app.dedicated.control.backend import AppObservation, AppSpec
from serve_app.dedicated.offer.catalog import app_spec
from serve_app.dedicated.pricing.meter import ReplicaMeter, Watched
from serve_app.dedicated.store import EndpointRow

logger = logging.getLogger(__name__)

LEASE_NAME = "dedicated-reconciler"
SETTLE = timedelta(seconds=1)
"""Serve's app status is trusted for a verdict only this long after our deploy."""


class Reconciler(BuiltOnContext):
    """Converges Serve to the store; ``converge_once`` is one blocking pass."""

    def __init__(self, ctx: DedicatedContext, holder: str | None = None) -> None:
        super().__init__(ctx)
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.meter = ReplicaMeter(ctx.store, deaths=ctx.backend.deaths)
        self._loop = PeriodicLoop(
            self.tick,
            lambda: self.options.reconcile_interval_s,
            logger=logger,
            failure="dedicated reconcile failed; retrying next period",
        )

    # ---- the loop -------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.store.release_lease, LEASE_NAME, self.holder)

    async def tick(self) -> bool:
        """One period: renew the lease, converge if held. Returns whether it converged."""
        held = await asyncio.to_thread(
            self.store.acquire_lease,
            LEASE_NAME,
            self.holder,
            self.options.lease_ttl_s,
            self.clock(),
        )
        if held:
            await asyncio.to_thread(self.converge_once)
        return held

    # ---- one pass ----------------------------------------------------------------
    def converge_once(self) -> None:
        now = self.clock()
        try:
            observed = self.backend.status()
        except Exception:
            logger.warning("could not read Serve's state; nothing changed", exc_info=True)
            return
        watched: dict[str, Watched] = {}
        wanted: set[str] = set()
        for row in self.store.list_live():
            app = app_name_for(row.slug)
            spec = self._spec(row)
            watched[app] = Watched(row, spec)
            if row.lifecycle in ("provisioning", "active"):
                wanted.add(app)
            self._converge(row, spec, observed.get(app), now)
        for name in observed:
            if is_dedicated_app(name) and name not in wanted:
                logger.info("deleting Serve app %s (no endpoint wants it)", name)
                self.backend.delete(name)
        self.meter.record(observed, watched, now)

    def _spec(self, row: EndpointRow) -> AppSpec | None:
        offering = self.offerings.get(row.model_id)
        return None if offering is None else app_spec(row, offering, self.options)

    def _converge(
        self, row: EndpointRow, spec: AppSpec | None, obs: AppObservation | None, now: datetime
    ) -> None:
        if row.lifecycle not in ("provisioning", "active"):
            # Paused, failed or deleted: nothing is deployed any more (the sweep below
            # deletes the app); the stored fingerprint goes once Serve no longer lists it.
            if row.live is not None or (obs is None and row.deployed_hash is not None):
                gone = {"deployed_hash": None} if obs is None else {}
                self.store.observe(row.id, live=None, observed_at=now, **gone)
            return
        if spec is None:
            logger.warning("endpoint %s: model %s left the catalog", row.id, row.model_id)
            return
        fingerprint = spec.fingerprint()
        if obs is None or row.deployed_hash != fingerprint:
            self._deploy(row, spec, fingerprint, obs, now)
            return
        self.store.observe(row.id, live=_live(obs), observed_at=now)
        if row.pending is not None:
            self._progress(row, obs, now)

    def _deploy(
        self,
        row: EndpointRow,
        spec: AppSpec,
        fingerprint: str,
        obs: AppObservation | None,
        now: datetime,
    ) -> None:
        logger.info("deploying %s (endpoint %s, version %d)", spec.name, row.id, row.deploy_version)
        try:
            self.backend.deploy(spec)
        except Exception as err:
            logger.exception("deploy of %s failed", spec.name)
            self._failed(row, f"deploy refused: {err}", now)
            return
        live = None if obs is None else _live(obs)
        self.store.observe(
            row.id, deployed_hash=fingerprint, deployed_at=now, live=live, observed_at=now
        )

    def _progress(self, row: EndpointRow, obs: AppObservation, now: datetime) -> None:
        """Move a pending provision/resume/redeploy/rollback on, or fail it.

        ``serve.run`` returns after the controller set the app to DEPLOYING, so
        once that settled, RUNNING means every deployment runs its target
        replica count on the new version (0 replicas for an endpoint at rest).
        """
        since = row.deployed_at or row.pending_since or now
        if now - since < SETTLE:
            return
        if obs.failed:
            self._failed(row, obs.message or "replicas failed to start", now)
            return
        if obs.running:
            if self.store.transition(row, lifecycle="active", pending=None, pending_since=None):
                logger.info("endpoint %s: %s done", row.id, row.pending)
            return
        if (now - since).total_seconds() > self.options.boot_timeout_s:
            self._failed(row, "no replica became ready in time", now)

    def _failed(self, row: EndpointRow, reason: str, now: datetime) -> None:
        previous = row.previous
        if row.pending in ("mode", "engine") and not row.rolled_back and previous:
            logger.warning("endpoint %s: %s failed (%s); rolling back", row.id, row.pending, reason)
            # Snapshots taken before the policy was part of them keep today's policy.
            restored = {"scaling": previous["scaling"]} if "scaling" in previous else {}
            self.store.transition(
                row,
                mode=previous["mode"],
                reserved_floor=previous["reserved_floor"],
                engine=previous.get("engine"),
                **restored,
                pending="rollback",
                pending_since=now,
                rolled_back=True,
                last_error=reason[:500],
                deploy_version=row.deploy_version + 1,
            )
            return
        logger.error("endpoint %s: %s failed (%s)", row.id, row.pending or "deploy", reason)
        self.store.transition(
            row, lifecycle="error", pending=None, pending_since=None, last_error=reason[:500]
        )


def _live(obs: AppObservation) -> dict[str, Any]:
    """What callers see as ``live``; per-deployment counts route hybrid calls."""
    deployments = sorted({r.deployment for r in obs.replicas})
    return {
        "ready": obs.ready,
        "total": obs.total,
        "ready_by_deployment": {name: obs.ready_in(name) for name in deployments},
    }
