"""How a video head replica gets its stores: the builder injects the gateway's factory.

``deployments`` may not import the gateway's storage code (see
``tests/unit/test_import_direction.py``), so ``VideoHead`` receives a
``VideoStoresFactory`` (``serve_app.contract.video``) with its arguments and
opens the job and object stores in its replica. These tests pin the three links
of that chain: the builder binds the factory, the factory pickles by reference
(it travels to the replica as Ray pickles it) and opens working stores from the
``GATEWAY_*`` environment, and the head calls it off its event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray import cloudpickle

import deployments.video.head as video_head
from serve_app.catalog.config import CatalogModel
from serve_app.config import GatewayAppArgs
from serve_app.jobs.store import JobStore, open_worker_stores
from serve_app.settings import get_settings
from serve_app.storage.db import Database
from serve_app.storage.objects import LocalObjectStore
from tests.unit.video.conftest import FAST

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_the_builder_binds_each_video_head_with_the_store_factory() -> None:
    from serve_app.builders import build_gateway_app

    args = yaml.safe_load((REPO_ROOT / "configs" / "local.yaml").read_text())["applications"][0][
        "args"
    ]
    pacing = GatewayAppArgs.model_validate(args).video.model_dump(mode="json")
    gateway = build_gateway_app(args)._bound_deployment
    heads = gateway.init_args[1]
    video_ids = [
        model.id
        for model in map(CatalogModel.model_validate, gateway.init_args[0]["catalog"])
        if model.head == "video" and model.id in heads
    ]
    assert video_ids, "configs/local.yaml binds no video head"
    for model_id in video_ids:
        init_args = heads[model_id]._bound_deployment.init_args
        assert init_args[0] == model_id
        assert init_args[3] == pacing  # the worker's pacing, as the gateway reads it
        assert init_args[4] is open_worker_stores


def test_the_store_factory_pickles_by_reference() -> None:
    # Ray pickles a deployment's arguments with cloudpickle; an importable function
    # travels as its name, so the replica opens stores with the gateway's own code.
    assert cloudpickle.loads(cloudpickle.dumps(open_worker_stores)) is open_worker_stores


@pytest.fixture
def gateway_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh state folder as the only ``GATEWAY_*`` setting (settings are cached)."""
    for name in ("GATEWAY_DATABASE_URL", "GATEWAY_OBJECT_STORE", "GATEWAY_OBJECTS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GATEWAY_STATE_DIR", str(tmp_path))
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


def test_the_store_factory_opens_a_migrated_job_store_and_the_object_store(
    gateway_env: Path,
) -> None:
    jobs, objects = open_worker_stores()
    assert isinstance(jobs, JobStore) and isinstance(objects, LocalObjectStore)
    assert jobs.claim_next("any-model", "worker-1") is None  # the video_jobs table exists
    objects.put("videos/check.mp4", b"mp4", "video/mp4")
    assert (gateway_env / "objects" / "videos" / "check.mp4").read_bytes() == b"mp4"


async def test_the_head_opens_its_stores_through_the_injected_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The replica's logging set-up would detach our loggers from pytest's capture.
    monkeypatch.setattr(video_head, "configure_replica_logging", lambda: None)
    database = Database(f"sqlite:///{tmp_path / 'gw.db'}")
    database.migrate()
    stores = (JobStore(database), LocalObjectStore(tmp_path / "objects"))
    calls: list[int] = []

    def open_stores() -> tuple[Any, Any]:
        calls.append(threading.get_ident())
        return stores

    replica_class: Any = video_head.VideoHead.func_or_class

    class Replica(replica_class):
        def __del__(self) -> None:
            """Garbage collection must not call Serve's async ``__del__`` (never awaited)."""

    head = Replica.__new__(Replica)
    await head.__init__(
        "scripted-video", "tests.fakes.scripted_video:ScriptedVideoEngine", {}, FAST, open_stores
    )
    try:
        assert len(calls) == 1 and calls[0] != threading.get_ident()  # off the event loop
        assert (head.core.jobs, head.core.objects) == stores
        assert head.core.options.poll_interval_s == FAST["poll_interval_s"]
        await head.check_health()
    finally:
        await replica_class.__del__(head)  # what Serve awaits when the replica stops
