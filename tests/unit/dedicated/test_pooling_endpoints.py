"""Dedicated endpoints of pooling (embedding, scoring) models: eligibility, the engine
offer, the app the reconciler deploys, and /v1/embeddings, /v1/rerank, /v1/score by
alias, on the fake Serve backend (the pooling head's real core around the scripted
pooling engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deployments.embeddings.config import VLLMPoolingConfig
from serve_app.billing.store import LedgerStore
from serve_app.catalog.config import CatalogModel
from serve_app.dedicated.control.backend import AppSpec, DeploymentSpec
from serve_app.dedicated.control.ray_backend import RayServeBackend, build_application
from serve_app.dedicated.offer.pooling import (
    POOLING_MIN_MODEL_LEN,
    VLLM_POOLING_DEFAULT_MAX_NUM_SEQS,
    pooling_engine_offer,
)
from serve_app.dedicated.options import DedicatedModelOptions
from tests.unit.dedicated.conftest import CATALOG, DedicatedHarness, build, create_body

EMBED: dict[str, Any] = {
    "id": "ded-embed",
    "head": "pooling",
    "output_modalities": ["embedding", "score"],
    "context_length": 512,
    "pooling": {"dimensions": 384, "score": "bi-encoder"},
    "pricing": {"mode": "fixed", "input_per_mtok": 0.02},
    "engine": {"backend": "vllm", "config": {"model": "x", "max_model_len": 512}},
    "deployment": {"max_ongoing_requests": 32},
}
RERANKER: dict[str, Any] = {
    **EMBED,
    "id": "ded-reranker",
    "output_modalities": ["score"],
    "pooling": {"score": "cross-encoder"},
    "engine": {
        "backend": "tests.fakes.scripted_pooling:ScriptedPoolingEngine",
        "config": {"embeds": False},
    },
}
ALIAS = "ded/my-embed"
EMBED_BODY = {"model": ALIAS, "input": ["a cat on a mat", "stock markets fell"]}


@pytest.fixture
async def pooled(tmp_path: Path) -> AsyncIterator[DedicatedHarness]:
    harness = build(tmp_path, catalog=[*CATALOG, EMBED, RERANKER])
    yield harness
    await harness.dedicated.router.stop()
    await harness.app.state.gateway.text.metering.aclose()


def _embed_body(**overrides: Any) -> dict[str, Any]:
    return create_body(model_id="ded-embed", alias_slug="my-embed", **overrides)


async def _active(ded: DedicatedHarness, c: httpx.AsyncClient, **overrides: Any) -> str:
    created = await c.post("/api/dedicated", json=_embed_body(**overrides))
    assert created.status_code == 201, created.text
    ded.converge()
    ded.converge(boot=True)
    eid: str = created.json()["endpoint_id"]
    assert (await c.get(f"/api/dedicated/{eid}")).json()["status"] == "active"
    return eid


# ---- eligibility and the engine offer ---------------------------------------------------
async def test_an_embedding_model_is_eligible_with_its_pooling_engine_bounds(
    pooled: DedicatedHarness,
) -> None:
    async with pooled.client() as c:
        created = await c.post("/api/dedicated", json=_embed_body())
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["model_id"] == "ded-embed" and body["alias"] == ALIAS
        bounds = body["engine_bounds"]
        assert bounds["max_model_len"] == {
            "available": True,
            "reason": None,
            "default": 512,
            "min": POOLING_MIN_MODEL_LEN,
            "max": 512,
        }
        assert bounds["max_num_seqs"]["available"] and bounds["max_num_seqs"]["max"] == 32
        for name in ("prefix_caching", "speculative_tokens"):
            assert bounds[name]["available"] is False
            assert bounds[name]["reason"] == "pooling_model"


async def test_engine_settings_a_pooling_model_cannot_take_are_refused(
    pooled: DedicatedHarness,
) -> None:
    async with pooled.client() as c:
        for engine in ({"prefix_caching": True}, {"speculative_tokens": 2}):
            refused = await c.post("/api/dedicated", json=_embed_body(engine=engine))
            assert refused.status_code == 400
            assert refused.json()["error"]["code"] == "engine_setting_unavailable"
        short = await c.post("/api/dedicated", json=_embed_body(engine={"max_model_len": 32}))
        assert short.status_code == 400 and short.json()["error"]["code"] == "invalid_value"
        chat_short = await c.post("/api/dedicated", json=create_body(engine={"max_model_len": 512}))
        assert chat_short.status_code == 400  # chat windows keep their 1024 floor
        assert chat_short.json()["error"]["code"] == "invalid_value"
        assert "1024" in chat_short.json()["error"]["message"]
        ok = await c.post(
            "/api/dedicated", json=_embed_body(engine={"max_model_len": 256, "max_num_seqs": 16})
        )
        assert ok.status_code == 201, ok.text
        pooled.converge()
        spec = pooled.backend.apps["ded-my-embed"].spec
        assert spec.engine_config == {"model": "x", "max_model_len": 256, "max_num_seqs": 16}
        assert spec.deployments[0].options["max_ongoing_requests"] == 32  # min(2 x 16, 32)


async def test_models_that_stay_ineligible(pooled: DedicatedHarness) -> None:
    async with pooled.client() as c:
        for model_id in ("ded-tts", "ded-banned", "nope"):
            body = create_body(model_id=model_id, alias_slug="x-" + model_id[-3:])
            refused = await c.post("/api/dedicated", json=body)
            assert refused.json()["error"]["code"] == "model_not_eligible", model_id


def test_the_pooling_offer_defaults_are_the_pooling_engines() -> None:
    model = CatalogModel.model_validate({**EMBED, "engine": {"backend": "vllm", "config": {}}})
    offer = pooling_engine_offer(model, DedicatedModelOptions())
    assert VLLMPoolingConfig(model="x").max_num_seqs == VLLM_POOLING_DEFAULT_MAX_NUM_SEQS
    assert offer.bounds.max_num_seqs.default == VLLM_POOLING_DEFAULT_MAX_NUM_SEQS
    assert offer.bounds.max_model_len.default == 512  # the catalog's window
    tiny = CatalogModel.model_validate({**EMBED, "context_length": 16})
    tiny = tiny.model_copy(update={"engine": model.engine})
    assert pooling_engine_offer(tiny, DedicatedModelOptions()).bounds.max_model_len.available is (
        False
    )


def test_a_scripted_pooling_backend_offers_only_what_it_declares() -> None:
    model = CatalogModel.model_validate(RERANKER)
    offer = pooling_engine_offer(model, DedicatedModelOptions(offered_settings=["max_num_seqs"]))
    assert offer.bounds.max_num_seqs.available
    assert offer.bounds.max_model_len.reason == "script_ignores_setting"
    assert offer.bounds.prefix_caching.reason == "pooling_model"


# ---- the app the reconciler deploys ------------------------------------------------------
async def test_the_reconciler_deploys_a_pooling_app_with_the_stored_autoscaling(
    pooled: DedicatedHarness,
) -> None:
    async with pooled.client() as c:
        policy = {"target_inputs": 4, "scale_down_idle_seconds": 120}
        await _active(pooled, c, min_replicas=0, max_replicas=3, scaling=policy)
        spec = pooled.backend.deployed[-1]
        assert spec.head == "pooling" and spec.model_id == ALIAS and spec.backend == "vllm"
        auto = spec.deployments[0].options["autoscaling_config"]
        assert auto["min_replicas"] == 0 and auto["max_replicas"] == 3
        assert auto["target_ongoing_requests"] == 4
        assert auto["downscale_delay_s"] == 120


def test_a_pooling_app_spec_is_its_own_fingerprint_and_chat_digests_stay() -> None:
    dep = DeploymentSpec("head", "spot", {"version": "v1"})
    chat = AppSpec("ded-a", "ded/a", "vllm", {}, (dep,))
    assert chat.head == "chat"
    assert AppSpec("ded-a", "ded/a", "vllm", {}, (dep,), head="chat").fingerprint() == (
        chat.fingerprint()
    )
    assert AppSpec("ded-a", "ded/a", "vllm", {}, (dep,), head="pooling").fingerprint() != (
        chat.fingerprint()
    )


class _Deployment:
    """Records what ``build_application`` makes of a head deployment."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.bound: list[tuple[Any, ...]] = []

    def options(self, **_: Any) -> _Deployment:
        return self

    def bind(self, *args: Any, **kwargs: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        return (self.name, args, kwargs)


def test_the_ray_backend_builds_a_pooling_app_from_the_pooling_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray import serve

    runs: list[Any] = []
    monkeypatch.setattr(serve, "run_many", lambda targets, **_: runs.extend(targets))
    backend = RayServeBackend(_Deployment("chat"), pooling_head=_Deployment("pooling"))
    head = DeploymentSpec("head", "reserved", {"version": "v1"})
    burst = DeploymentSpec("burst", "spot", {"version": "v1"})
    spec = AppSpec("ded-e", "ded/e", "vllm", {"model": "x"}, (head, burst), head="pooling")
    backend.deploy(spec)
    [target] = runs
    assert target.name == "ded-e"
    name, args, kwargs = target.target
    assert name == "pooling" and args == ("ded/e", "vllm", {"model": "x"})
    assert kwargs["peers"][0] == "pooling"  # hybrid's burst: the same head
    chat = build_application(_Deployment("chat"), AppSpec("ded-c", "ded/c", "vllm", {}, (head,)))
    assert chat[0] == "chat"
    with pytest.raises(RuntimeError, match="pooling"):
        RayServeBackend(_Deployment("chat")).deploy(spec)


# ---- calls by alias ----------------------------------------------------------------------
async def test_embeddings_by_alias_are_served_recorded_and_priced_at_zero(
    pooled: DedicatedHarness,
) -> None:
    async with pooled.client() as c:
        eid = await _active(pooled, c)
        answer = await c.post("/v1/embeddings", json=EMBED_BODY)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["model"] == ALIAS and [d["index"] for d in body["data"]] == [0, 1]
        assert len(body["data"][0]["embedding"]) == 384
        tokens = body["usage"]["prompt_tokens"]
        assert tokens > 0
        scored = await c.post(
            "/v1/score", json={"model": ALIAS, "text_1": "a cat", "text_2": ["a cat", "bonds"]}
        )
        assert scored.status_code == 200, scored.text
        assert scored.json()["data"][0]["score"] > scored.json()["data"][1]["score"]
        ranked = await c.post(
            "/v1/rerank", json={"model": ALIAS, "query": "cat", "documents": ["bonds", "cat"]}
        )
        assert ranked.status_code == 200 and ranked.json()["results"][0]["index"] == 1
        pooled.converge()  # flushes the per-call records
        telemetry = (await c.get(f"/api/dedicated/{eid}/telemetry?window=24h")).json()
        assert telemetry["requests"] == {"ok": 3, "incomplete": 0, "error": 0}
        assert telemetry["tokens"]["completion"] == 0 and telemetry["tokens"]["prompt"] >= tokens
        health = (await c.get(f"/api/dedicated/{eid}/health")).json()
        assert health["sampled"] is True and health["reason"] is None, health
        assert health["replicas"][0]["tokens"] == telemetry["tokens"]["prompt"]  # input tokens
    ledger = pooled.app.state.gateway.text.metering.ledger
    assert ledger is not None and await ledger.flush()
    user = pooled.store.get_user("ann")
    assert user is not None
    rows = [r for r in LedgerStore(ledger.store._db).records_for(user.id) if r.model == ALIAS]
    assert sorted(r.route for r in rows) == ["embeddings", "rerank", "score"]
    assert all(r.prompt_tokens > 0 and r.completion_tokens == 0 for r in rows)
    assert all(r.cost == 0 for r in rows)  # minutes are billed, not tokens


async def test_alias_refusals_on_the_pooling_routes(pooled: DedicatedHarness) -> None:
    async with pooled.client() as c:
        created = await c.post("/api/dedicated", json=_embed_body())
        pooled.converge()
        pooled.converge()
        warming = await c.post("/v1/embeddings", json=EMBED_BODY)
        assert warming.status_code == 503
        assert warming.json()["error"]["code"] == "model_warming"
        pooled.converge(boot=True)
        chat = await c.post(
            "/v1/chat/completions",
            json={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 400
        assert chat.json()["error"]["code"] == "model_not_supported_for_endpoint"
        too_short = await c.post("/v1/embeddings", json={**EMBED_BODY, "dimensions": 8})
        assert too_short.json()["error"]["code"] == "unsupported_parameter"
        await c.post(f"/api/dedicated/{created.json()['endpoint_id']}/pause")
        paused = await c.post("/v1/embeddings", json=EMBED_BODY)
        assert paused.status_code == 503
    async with pooled.client("other") as c:
        foreign = await c.post("/v1/embeddings", json=EMBED_BODY)
        assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "model_not_found"


async def test_a_chat_alias_is_refused_on_embeddings(pooled: DedicatedHarness) -> None:
    async with pooled.client() as c:
        assert (await c.post("/api/dedicated", json=create_body())).status_code == 201
        pooled.converge()
        pooled.converge(boot=True)
        refused = await c.post("/v1/embeddings", json={**EMBED_BODY, "model": "ded/my-bot"})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "model_not_supported_for_endpoint"


async def test_a_score_only_endpoint_and_a_call_that_boots_from_zero(
    pooled: DedicatedHarness,
) -> None:
    body = create_body(model_id="ded-reranker", alias_slug="my-rank", min_replicas=0)
    async with pooled.client() as c:
        created = await c.post("/api/dedicated", json=body)
        assert created.status_code == 201, created.text
        pooled.converge()
        pooled.converge(boot=True)
        assert pooled.backend.replica_ids("ded-my-rank") == []
        ranked = await c.post(
            "/v1/rerank",
            json={"model": "ded/my-rank", "query": "cat", "documents": ["cat", "dog"]},
        )
        assert ranked.status_code == 200, ranked.text
        assert len(pooled.backend.replica_ids("ded-my-rank")) == 1  # the call booted one
        embed = await c.post("/v1/embeddings", json={**EMBED_BODY, "model": "ded/my-rank"})
        assert embed.status_code == 400
        pooled.converge()
        eid = created.json()["endpoint_id"]
        telemetry = (await c.get(f"/api/dedicated/{eid}/telemetry?window=24h")).json()
        assert telemetry["requests"]["ok"] == 1
        assert telemetry["cold_wait_ms"]["requests_with_wake"] == 1


async def test_hybrid_pooling_calls_go_to_the_floor_then_the_burst(
    pooled: DedicatedHarness,
) -> None:
    async with pooled.client() as c:
        await _active(
            pooled,
            c,
            mode="hybrid",
            reserved_floor=1,
            min_replicas=2,
            max_replicas=3,
            scaling={"target_inputs": 1},
        )
        app = pooled.backend.apps["ded-my-embed"]
        assert {d.name: d.capacity_class for d in app.spec.deployments} == {
            "head": "reserved",
            "burst": "spot",
        }
        assert (await c.post("/v1/embeddings", json=EMBED_BODY)).status_code == 200
        router = pooled.dedicated.router
        # The floor's one slot taken by a call in flight: the next call bursts to spot.
        assert await router.floor.choose("ded-my-embed", "head", "burst", 1, "held") == "head"
        assert (await c.post("/v1/embeddings", json=EMBED_BODY)).status_code == 200
        calls = {r.deployment: r.calls for r in app.replicas}
        assert calls == {"head": 1, "burst": 1}
        assert router.in_flight == {("ded-my-embed", "head"): 0, ("ded-my-embed", "burst"): 0}
