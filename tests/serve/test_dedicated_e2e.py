"""Dedicated endpoints end to end: real ``ded-<slug>`` Serve apps next to the ``gateway`` app.

The gateway replica's reconciler deploys, updates and deletes the apps; the
test drives the public API (raw HTTP and the openai client) and checks Serve's
own state (replica ids, actor resources) from the driver. The model is a
scripted engine at a tenth of a CPU per replica, so boots take seconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from deployments.dedicated_head import DedicatedHead
from serve_app.dedicated.control.backend import AppObservation, AppSpec
from serve_app.dedicated.control.ray_backend import RayServeBackend
from tests.serve.conftest import ServeStack
from tests.serve.dedicated_config import DEDICATED_MODEL

pytestmark = pytest.mark.serve

Json = dict[str, Any]


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def serve_apps() -> dict[str, AppObservation]:
    return RayServeBackend(DedicatedHead).status()


def replica_ids(app: str) -> set[str]:
    obs = serve_apps().get(app)
    return {r.replica_id for r in obs.replicas} if obs else set()


@pytest.fixture(scope="module")
def admin(serve_stack: ServeStack) -> Iterator[httpx.Client]:
    key = serve_stack.store.create_key("ded-admin", "ded-e2e-org", role="admin")
    with serve_stack.http(key) as client:
        client.headers["x-test-key"] = key
        yield client


def endpoint(http: httpx.Client, eid: str) -> Json:
    resp = http.get(f"/api/dedicated/{eid}")
    assert resp.status_code == 200, resp.text
    body: Json = resp.json()
    return body


def until_status(http: httpx.Client, eid: str, status: str, timeout: float = 90.0) -> Json:
    found: Json = wait_for(
        f"{eid} {status}",
        lambda: (e := endpoint(http, eid))["status"] == status and e,
        timeout,
    )
    return found


def chat(stack: ServeStack, key: str, model: str) -> str:
    client = stack.openai(key)
    result = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "ping pong"}], max_tokens=4
    )
    assert result.model == model
    return result.choices[0].message.content or ""


def test_endpoint_life_on_real_serve(serve_stack: ServeStack, admin: httpx.Client) -> None:
    key = admin.headers["x-test-key"]
    eid = _create_and_serve(serve_stack, admin, key)
    first = replica_ids("ded-e2e-life")
    _patch_is_live(admin, eid, first)
    _mode_change_replaces_replicas(serve_stack, admin, key, eid, first)
    _failed_engine_change_rolls_back(admin, eid)
    _pause_releases_and_resume_boots(serve_stack, admin, key, eid)
    _bill_is_the_sum_of_replica_lives(admin, eid)
    assert admin.delete(f"/api/dedicated/{eid}").json()["status"] == "deleted"
    with pytest.raises(openai.NotFoundError) as gone:
        chat(serve_stack, key, "ded/e2e-life")
    assert gone.value.code == "model_not_found"
    wait_for("app deleted", lambda: "ded-e2e-life" not in serve_apps())
    assert "gateway" in serve_apps()


def _create_and_serve(stack: ServeStack, admin: httpx.Client, key: str) -> str:
    body = {"model_id": DEDICATED_MODEL, "alias_slug": "e2e-life", "mode": "spot"}
    created = admin.post("/api/dedicated", json={**body, "min_replicas": 1, "max_replicas": 2})
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "provisioning"
    eid: str = created.json()["endpoint_id"]
    state = until_status(admin, eid, "active")
    assert state["live"] == {"replicas_ready": 1, "replicas_total": 1}
    assert chat(stack, key, "ded/e2e-life") == "ping pong"
    return eid


def _patch_is_live(admin: httpx.Client, eid: str, first: set[str]) -> None:
    policy = {"target_inputs": 2, "scale_down_idle_seconds": 30, "buffer_replicas": 1}
    patched = admin.patch(f"/api/dedicated/{eid}", json={"max_replicas": 3, "scaling": policy})
    assert patched.status_code == 200 and patched.json()["scaling"]["profile"] == "custom"
    wait_for("patch applied", lambda: serve_apps()["ded-e2e-life"].running)
    time.sleep(2)
    assert replica_ids("ded-e2e-life") == first  # lightweight update: same replica


def _mode_change_replaces_replicas(
    stack: ServeStack, admin: httpx.Client, key: str, eid: str, first: set[str]
) -> None:
    change = {"mode": "reserved", "confirm_redeploy": True}
    moved = admin.put(f"/api/dedicated/{eid}/mode", json=change)
    assert moved.status_code == 200 and moved.json()["status"] == "updating"
    until_status(admin, eid, "active")
    assert replica_ids("ded-e2e-life").isdisjoint(first)  # replaced in place
    assert chat(stack, key, "ded/e2e-life") == "ping pong"


def _failed_engine_change_rolls_back(admin: httpx.Client, eid: str) -> None:
    bad = {"engine": {"max_num_seqs": 3}, "confirm_redeploy": True}  # the engine cannot start
    assert admin.put(f"/api/dedicated/{eid}/engine", json=bad).json()["status"] == "updating"
    rolled = wait_for(
        "rollback",
        lambda: (e := endpoint(admin, eid))["status"] == "active" and e["engine"] is None and e,
        120,
    )
    assert rolled["mode"] == "reserved" and rolled["previous_mode"] == "spot"
    history = admin.get(f"/api/dedicated/{eid}/scaling-history").json()["items"]
    assert any(item["error_code"] == "boot_failed" for item in history), history


def _pause_releases_and_resume_boots(
    stack: ServeStack, admin: httpx.Client, key: str, eid: str
) -> None:
    assert admin.post(f"/api/dedicated/{eid}/pause").json()["status"] == "paused"
    wait_for("replicas released", lambda: "ded-e2e-life" not in serve_apps())
    assert endpoint(admin, eid)["live"] is None
    assert admin.post(f"/api/dedicated/{eid}/resume").json()["status"] == "warming"
    until_status(admin, eid, "active")
    assert chat(stack, key, "ded/e2e-life") == "ping pong"


def _bill_is_the_sum_of_replica_lives(admin: httpx.Client, eid: str) -> None:
    billed = endpoint(admin, eid)
    minutes = billed["month_minutes"]
    assert minutes["spot"] > 0 and minutes["reserved"] > 0
    lives = admin.get(f"/api/dedicated/{eid}/scaling-history").json()["items"]
    measured = sum(_life_minutes(item) for item in lives)
    assert abs(minutes["spot"] + minutes["reserved"] - measured) < 0.1
    expected = minutes["spot"] * 0.06 / 60 + minutes["reserved"] * 0.12 / 60
    assert billed["month_cost"] == pytest.approx(expected, rel=0.05)


def _life_minutes(item: Json) -> float:
    from datetime import UTC, datetime

    start = datetime.fromisoformat(item["scaled_up_at"].replace("Z", "+00:00"))
    end_text = item["scaled_down_at"]
    end = datetime.fromisoformat(end_text.replace("Z", "+00:00")) if end_text else datetime.now(UTC)
    return (end - start).total_seconds() / 60


class CountingBackend(RayServeBackend):
    """The real backend, counting the apps it deploys and deletes."""

    def __init__(self) -> None:
        super().__init__(DedicatedHead)
        self.deployed: list[str] = []
        self.deleted: list[str] = []

    def deploy(self, spec: AppSpec) -> None:
        self.deployed.append(spec.name)
        super().deploy(spec)

    def delete(self, app_name: str) -> None:
        self.deleted.append(app_name)
        super().delete(app_name)


def test_scale_to_zero_wake_and_reconciler_restart(
    serve_stack: ServeStack, admin: httpx.Client
) -> None:
    from serve_app.config import GatewayAppArgs
    from serve_app.dedicated.context import DedicatedContext
    from serve_app.dedicated.control.reconciler import Reconciler
    from serve_app.dedicated.offer.catalog import Offerings
    from serve_app.dedicated.store import DedicatedStore
    from serve_app.storage.db import Database
    from tests.serve.conftest import _catalog
    from tests.serve.dedicated_config import DEDICATED_ARGS

    key = admin.headers["x-test-key"]
    body = {"model_id": DEDICATED_MODEL, "alias_slug": "e2e-zero", "mode": "spot"}
    created = admin.post("/api/dedicated", json={**body, "min_replicas": 0, "max_replicas": 1})
    eid = created.json()["endpoint_id"]
    at_rest = until_status(admin, eid, "active")
    assert at_rest["live"] == {"replicas_ready": 0, "replicas_total": 0}
    assert admin.get(f"/api/dedicated/{eid}/health").json()["sampled"] is False
    assert replica_ids("ded-e2e-zero") == set()  # sampling did not wake it

    assert chat(serve_stack, key, "ded/e2e-zero") == "ping pong"  # the first call boots one
    woken = wait_for(
        "woken", lambda: (e := endpoint(admin, eid))["live"]["replicas_ready"] == 1 and e
    )
    assert woken["status"] == "active"
    telemetry = admin.get(f"/api/dedicated/{eid}/telemetry?window=1h").json()
    assert telemetry["requests"]["ok"] == 1 and telemetry["cold_wait_ms"]["requests_with_wake"] == 1
    health = admin.get(f"/api/dedicated/{eid}/health").json()
    assert health["sampled"] is True and health["replicas_sampled"] == 1

    # A new reconciler (a restarted gateway) adopts the running app and leaves 'gateway' alone.
    config = GatewayAppArgs.model_validate({"catalog": _catalog(), "dedicated": DEDICATED_ARGS})
    backend = CountingBackend()
    fresh = Reconciler(
        DedicatedContext(
            DedicatedStore(Database(os.environ["GATEWAY_DATABASE_URL"])),
            Offerings(config.catalog, config.dedicated),
            config.dedicated,
            backend,
        )
    )
    before = replica_ids("ded-e2e-zero")
    fresh.converge_once()
    assert backend.deployed == [] and backend.deleted == []
    assert replica_ids("ded-e2e-zero") == before and "gateway" in serve_apps()

    assert admin.delete(f"/api/dedicated/{eid}").status_code == 200
    wait_for("app deleted", lambda: "ded-e2e-zero" not in serve_apps())
