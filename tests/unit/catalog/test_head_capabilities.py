"""What /v1/models promises follows what the head can really do (issue: no silent drops)."""

from __future__ import annotations

import yaml

from serve_app.catalog.catalog import model_card, supported_parameters
from serve_app.catalog.config import CatalogModel
from serve_app.config import REPO_ROOT
from tests.fixtures.gateway import GatewayHarness


def _local(model_id: str) -> CatalogModel:
    data = yaml.safe_load((REPO_ROOT / "configs" / "catalog" / "local.yaml").read_text())
    entry = next(m for m in data["models"] if m["id"] == model_id)
    return CatalogModel.model_validate(entry)


def test_tools_only_where_the_head_has_a_tool_call_parser() -> None:
    qwen = supported_parameters(_local("qwen2.5-coder-1.5b-instruct"))
    smollm = supported_parameters(_local("smollm2-135m-instruct"))
    assert {"tools", "tool_choice"} <= set(qwen)
    assert "tools" not in smollm and "tool_choice" not in smollm
    flagged_without_parser = _local("qwen2.5-coder-1.5b-instruct").model_copy(deep=True)
    del flagged_without_parser.engine.config["tool_call_parser"]
    assert "tools" not in supported_parameters(flagged_without_parser)


def test_vllm_heads_offer_logprobs_and_grammar_outputs() -> None:
    for model_id in ("smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct"):
        params = set(supported_parameters(_local(model_id)))
        assert {"logprobs", "top_logprobs", "response_format"} <= params, model_id


def test_external_models_promise_only_their_catalog_flags() -> None:
    params = set(supported_parameters(_local("loopback/smollm2-135m-instruct")))
    assert not params & {"logprobs", "top_logprobs", "tools"}


def test_the_reasoning_demo_promises_no_structured_outputs() -> None:
    """Its random reasoning never ends, so vLLM's grammar would never apply."""
    demo = _local("qwen3-tiny-reasoning-demo")
    assert demo.engine.backend == "vllm" and demo.structured_outputs is False
    params = set(supported_parameters(demo))
    assert not params & {"response_format", "structured_outputs"}
    assert {"logprobs", "reasoning_effort"} <= params


async def test_chat_refuses_structured_outputs_where_not_offered(gateway: GatewayHarness) -> None:
    """``scripted-reasoner`` says ``structured_outputs: false``, as the demo does."""
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    asks = [
        ("response_format", {"response_format": schema}),
        ("response_format", {"response_format": {"type": "json_object"}}),
        ("structured_outputs", {"structured_outputs": {"json": {"type": "object"}}}),
    ]
    async with gateway.client(gateway.keys["user"]) as http:
        for param, fields in asks:
            body = {"model": "scripted-reasoner", "messages": [{"role": "user", "content": "hi"}]}
            resp = await http.post("/v1/chat/completions", json={**body, **fields})
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["code"] == "unsupported_parameter"
            assert resp.json()["error"]["param"] == param
        plain = {"type": "text"}  # asks for nothing a grammar does
        body = {"model": "scripted-reasoner", "messages": [{"role": "user", "content": "hi"}]}
        resp = await http.post("/v1/chat/completions", json={**body, "response_format": plain})
        assert resp.status_code == 200, resp.text


def test_supported_parameters_only_on_chat_cards() -> None:
    """The contract's card lists ``supported_parameters`` for chat models only: a client
    telling chat models apart by it must not take an embeddings model for one."""
    data = yaml.safe_load((REPO_ROOT / "configs" / "catalog" / "local.yaml").read_text())
    models = [CatalogModel.model_validate(entry) for entry in data["models"]]
    assert any(m.head == "pooling" for m in models)
    for model in models:
        listed = model_card(model).supported_parameters is not None
        assert listed == (model.head == "chat"), model.id
