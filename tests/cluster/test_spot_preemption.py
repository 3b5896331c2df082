"""A spot preemption on a real two-node Ray cluster (the shape of cluster.yaml, one machine).

The head node offers what cluster.yaml's head offers (``capacity_reserved``
and the ``gateway_host`` slots the ingress asks for); a second node joins with
``ray start --address ... --resources '{"capacity_spot": 1}'`` and nothing
else, as a spot GPU worker does. A spot dedicated endpoint's replica lands on
it; the node is then killed outright (SIGKILL of its whole process group: a
preemption without notice; Serve stops the unreachable replica within seconds,
the GCS declares the node dead from missed health checks ~15 s after its last
sign of life). The test checks what a customer and the bill see:

- the replica's life ends when the node died, not when Serve or the GCS
  noticed (the scaling history's ``scaled_down_at``; state ``lost``);
- while nothing is ready the endpoint is ``warming`` and calls get 503
  ``model_warming`` with ``Retry-After``; the replacement waiting for spot
  capacity bills nothing;
- when a spot node joins again the replacement lands there and the endpoint
  serves again.

Every wait is bounded (about a minute in all); the fixture ends every process
it started (the node groups, the driver, and any process carrying this
cluster's own auth token) and checks none is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve_app.auth.accounts import AccountStore
from serve_app.config import REPO_ROOT
from serve_app.dedicated.pricing.meter import PLACEMENT_GRACE
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database
from tests.cluster.local_cluster import LocalCluster, Node, free_port
from tests.serve.dedicated_config import DEDICATED_ARGS, DEDICATED_MODEL, dedicated_catalog

pytestmark = pytest.mark.cluster

Json = dict[str, Any]

HEAD_RESOURCES = {"capacity_reserved": 1.0, "gateway_host": 4.0}
SPOT_RESOURCES = {"capacity_spot": 1.0}
APP = "ded-spot-e2e"
ALIAS = "ded/spot-e2e"
DEATH_TOLERANCE = timedelta(seconds=5)
"""The GCS's last evidence of life is at most a health-check period (3 s) from the death;
plus the checks' own time and the clock reads on either side."""


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        value = check()
        if value:
            print(
                f"{datetime.now(UTC):%H:%M:%S.%f} {what} after {time.monotonic() - started:.1f} s"
            )
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def gateway_args() -> Json:
    """The session's scripted dedicated model, with every shared replica kept off spot nodes
    (cluster.yaml's placement: ingress on ``gateway_host``, catalog heads on their class)."""
    # Only the chat model: the pooling one would be one more shared head to place off spot nodes.
    model = next(m for m in dedicated_catalog() if m["id"] == DEDICATED_MODEL)
    deployment = dict(model["deployment"])
    deployment["ray_actor_options"] = {
        **deployment["ray_actor_options"],
        "resources": {"capacity_reserved": 0.001},
    }
    return {
        "catalog": [{**model, "deployment": deployment}],
        "dedicated": DEDICATED_ARGS,
        "ingress": {"ray_actor_options": {"num_cpus": 0.25, "resources": {"gateway_host": 1}}},
        "tool_runner": {"enabled": False},
        "timeouts": {"first_event_s": 30},
    }


class Driver:
    """``tests.cluster.serve_driver`` as a child process, asked one JSON line at a time."""

    def __init__(self, cluster: LocalCluster, http_port: int, args_file: Path) -> None:
        self.log = cluster.root / "driver.log"
        with self.log.open("ab") as err:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.cluster.serve_driver",
                    "--address",
                    cluster.address,
                    "--http-port",
                    str(http_port),
                    "--args-file",
                    str(args_file),
                ],
                cwd=REPO_ROOT,
                env=cluster.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)

    def reply(self, timeout: float) -> Json:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"driver gave no answer in {timeout} s:\n{tail}") from None
        answer: Json = json.loads(line)
        assert "error" not in answer, answer
        return answer

    def status(self) -> Json:
        assert self.process.stdin is not None
        self.process.stdin.write("status\n")
        self.process.stdin.flush()
        return self.reply(timeout=30)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.process.stdin is not None
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@dataclass
class SpotStack:
    cluster: LocalCluster
    driver: Driver
    http: httpx.Client
    spot: Node


@pytest.fixture
def spot_stack(tmp_path: Path) -> Iterator[SpotStack]:
    db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    database = Database(db_url)
    database.migrate()
    key = AccountStore(database, pepper=GatewaySettings().key_pepper).create_key(
        "spot-admin", "spot-org", role="admin"
    )
    args_file = tmp_path / "gateway-args.json"
    args_file.write_text(json.dumps(gateway_args()))
    cluster = LocalCluster.create(
        tmp_path / "cluster",
        {
            "GATEWAY_DATABASE_URL": db_url,
            "GATEWAY_STATE_DIR": str(tmp_path / "state"),
            "GATEWAY_AUTH_CACHE_SECONDS": "0",
            "HF_HUB_OFFLINE": "1",
        },
    )
    driver: Driver | None = None
    try:
        cluster.start_head(num_cpus=2, resources=HEAD_RESOURCES)
        spot = cluster.add_node("spot-1", num_cpus=1, resources=SPOT_RESOURCES)
        port = free_port()
        driver = Driver(cluster, port, args_file)
        assert driver.reply(timeout=120) == {"deployed": True}
        base_url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base_url, headers=headers, timeout=30) as http:
            wait_for("the gateway", lambda: _answers(http), timeout=120)
            yield SpotStack(cluster, driver, http, spot)
    finally:
        if driver is not None:
            driver.close()
        cluster.close()
        time.sleep(0.5)
        assert cluster.stragglers() == [], "processes of the test cluster outlived it"
        assert all(n.process.poll() is not None for n in cluster.nodes)


def _answers(http: httpx.Client) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return http.get("/api/dedicated").status_code == 200
    return False


def endpoint(http: httpx.Client, eid: str) -> Json:
    resp = http.get(f"/api/dedicated/{eid}")
    assert resp.status_code == 200, resp.text
    body: Json = resp.json()
    return body


def history(http: httpx.Client, eid: str) -> list[Json]:
    resp = http.get(f"/api/dedicated/{eid}/scaling-history")
    assert resp.status_code == 200, resp.text
    items: list[Json] = resp.json()["items"]
    return items


def chat(http: httpx.Client) -> httpx.Response:
    body = {"model": ALIAS, "messages": [{"role": "user", "content": "ping pong"}], "max_tokens": 4}
    return http.post("/v1/chat/completions", json=body)


def life_of(http: httpx.Client, eid: str, replica_id: str) -> Json:
    (item,) = [i for i in history(http, eid) if i["replica_id"] == replica_id]
    return item


def waited_past_grace(driver: Driver) -> bool:
    """Whether one unplaced replica stayed the same and unplaced for PLACEMENT_GRACE + 2 s."""
    before = driver.status()["apps"][APP]["replicas"]
    time.sleep(PLACEMENT_GRACE.total_seconds() + 2)
    after = driver.status()["apps"][APP]["replicas"]
    ids = [(r["replica_id"], bool(r["node_id"])) for r in before]
    return (
        len(ids) == 1
        and not ids[0][1]
        and ids == [(r["replica_id"], bool(r["node_id"])) for r in after]
    )


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def spot_nodes(state: Json) -> set[str]:
    return {
        node_id
        for node_id, node in state["nodes"].items()
        if node["alive"] and "capacity_spot" in node["resources"]
    }


def placement(state: Json, app: str) -> set[str | None]:
    replicas = state["apps"].get(app, {}).get("replicas", [])
    return {r["node_id"] for r in replicas if r["state"] == "RUNNING"}


def test_spot_preemption_bills_until_the_death_and_recovers(spot_stack: SpotStack) -> None:
    http, driver = spot_stack.http, spot_stack.driver
    body = {"model_id": DEDICATED_MODEL, "alias_slug": "spot-e2e", "mode": "spot"}
    created = http.post("/api/dedicated", json={**body, "min_replicas": 1, "max_replicas": 1})
    assert created.status_code == 201, created.text
    eid: str = created.json()["endpoint_id"]
    wait_for("active", lambda: endpoint(http, eid)["status"] == "active", timeout=60)
    first = chat(http)
    assert first.status_code == 200, first.text

    # The replica holds the spot node; nothing of the gateway itself does.
    state = driver.status()
    (spot_node,) = spot_nodes(state)
    assert placement(state, APP) == {spot_node}
    shared = [r for r in state["apps"]["gateway"]["replicas"] if r["node_id"] == spot_node]
    assert shared == []
    (life,) = history(http, eid)
    assert life["scaled_down_at"] is None and life["capacity_class"] == "spot"

    # Preemption without notice.
    killed_at = datetime.now(UTC)
    spot_stack.spot.kill()

    warming = wait_for(
        "warming", lambda: (e := endpoint(http, eid))["status"] == "warming" and e, timeout=60
    )
    assert warming["live"] == {"replicas_ready": 0, "replicas_total": 1}  # the replacement
    # The router's alias cache is re-read every refresh_s: give it that (a call it admits
    # on a stale "ready" goes to Serve, which holds it until a replica runs).
    time.sleep(3 * DEDICATED_ARGS["refresh_s"])
    refused = chat(http)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "model_warming"
    assert int(refused.headers["Retry-After"]) >= 1

    # The life ends at the death, although Ray's verdict on the node came ~15 s later.
    ended = wait_for(
        "the lost life dated at the death",
        lambda: (item := life_of(http, eid, life["replica_id"]))["state"] == "lost" and item,
        timeout=60,
    )
    seen_closed_at = datetime.now(UTC)
    died = when(ended["scaled_down_at"])
    print(f"killed {killed_at:%H:%M:%S.%f}, billed until {died:%H:%M:%S.%f}")
    assert ended["error_code"] == "node_lost"
    assert abs(died - killed_at) <= DEATH_TOLERANCE, (died, killed_at)
    assert seen_closed_at - died >= timedelta(seconds=8), "closed at detection, not at death"
    # The replacement waits for spot capacity: it has no life yet, so it bills nothing. (Until
    # the verdict, the GCS may have sent a first replacement to the dead node's free
    # capacity_spot; the verdict fails it and Serve starts another.) One left waiting longer
    # than a process start-up takes (PLACEMENT_GRACE) is plainly waiting for capacity.
    wait_for(
        "a replacement left waiting past the grace",
        lambda: waited_past_grace(driver),
        timeout=3 * PLACEMENT_GRACE.total_seconds(),
        every=0,
    )
    assert [i["replica_id"] for i in history(http, eid)] == [life["replica_id"]]

    # Capacity returns: a new spot node joins, the replacement lands there and serves.
    returned_at = datetime.now(UTC)
    spot_stack.cluster.add_node("spot-2", num_cpus=1, resources=SPOT_RESOURCES)
    wait_for("active again", lambda: endpoint(http, eid)["status"] == "active", timeout=90)
    served = chat(http)
    assert served.status_code == 200, served.text
    state = driver.status()
    (new_node,) = spot_nodes(state)
    assert new_node != spot_node and placement(state, APP) == {new_node}
    lives = history(http, eid)
    assert len(lives) == 2
    replacement = lives[0]
    assert replacement["replica_id"] != life["replica_id"] and replacement["scaled_down_at"] is None
    # Billed from when capacity came back, not from when it started waiting for it.
    assert when(replacement["scaled_up_at"]) >= returned_at - timedelta(seconds=3)
    minutes = endpoint(http, eid)["month_minutes"]
    assert minutes["reserved"] == 0 and minutes["spot"] > 0
