"""``GET /v1/models`` and the card rules of docs/reference/models.md#model-card."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from serve_app.catalog.catalog import model_card, supported_parameters
from serve_app.catalog.config import CatalogModel
from tests.fixtures.gateway import GatewayHarness


async def _cards(gateway: GatewayHarness, key: str) -> dict[str, dict[str, object]]:
    async with gateway.client(key) as http:
        resp = await http.get("/v1/models")
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "list"
    return {card["id"]: card for card in body["data"]}


async def test_external_listed_only_to_enabled_orgs(gateway: GatewayHarness) -> None:
    plain = await _cards(gateway, gateway.keys["user"])
    enabled = await _cards(gateway, gateway.keys["external"])
    assert "external-chat" not in plain
    external = enabled["external-chat"]
    assert external["routing"] == {
        "provider_class": "external",
        "residency": "external",
        "notice": external["routing"]["notice"],  # type: ignore[index]
    }
    assert "pricing" not in external
    assert "pricing" in enabled["scripted-chat"]


async def test_card_fields(gateway: GatewayHarness) -> None:
    cards = await _cards(gateway, gateway.keys["user"])
    chat = cards["scripted-chat"]
    assert chat["object"] == "model"
    assert chat["context_length"] == chat["context_window"] == chat["max_model_len"] == 64
    assert chat["max_output_tokens"] == 32
    assert chat["spot_enabled"] is False
    assert "spot_multiplier" not in chat and "gpu_class" not in chat
    assert "routing" not in chat
    spot = cards["scripted-spot"]
    assert spot["spot_enabled"] is True
    assert spot["spot_multiplier"] == 0.5 and spot["gpu_class"] == "l4"
    speech = cards["tts-model"]
    assert "context_length" not in speech and "supported_parameters" not in speech
    assert "reasoning" not in speech
    assert cards["scripted-reasoner"]["reasoning"] == {
        "controllable": True,
        "separate_channel": True,
    }


def test_supported_parameters_only_what_is_honoured() -> None:
    scripted = {"backend": "tests.fakes.scripted_engine:ScriptedEngine"}
    base = CatalogModel(
        id="m", head="chat", context_length=10, max_output_tokens=5, engine=scripted
    )
    tools = base.model_copy(update={"native_tool_calling": True})
    sep = base.model_copy(
        update={"reasoning": base.reasoning.model_copy(update={"separate_channel": True})}
    )
    assert "tools" not in supported_parameters(base)
    assert "reasoning_effort" not in supported_parameters(base)
    assert "structured_outputs" not in supported_parameters(base)
    assert {"tools", "tool_choice"} <= set(supported_parameters(tools))
    assert "stop" in supported_parameters(base) and "stop" not in supported_parameters(sep)
    assert model_card(base).supported_parameters == supported_parameters(base)


def test_demo_models_publish_their_tier_and_notice() -> None:
    demo = CatalogModel(
        id="tiny-ocr",
        head="parse",
        tier="demo",
        notice="Random-weight stand-in: its text is random.",
    )
    card = model_card(demo).model_dump(exclude_none=True)
    assert card["tier"] == "demo"
    assert card["notice"] == "Random-weight stand-in: its text is random."
    assert "notice" not in model_card(CatalogModel(id="m", head="parse")).model_dump(
        exclude_none=True
    )
    with pytest.raises(ValidationError, match="needs a notice"):
        CatalogModel(id="tiny-ocr", head="parse", tier="demo")


def test_catalog_entries_are_strict() -> None:
    with pytest.raises(ValidationError):
        CatalogModel.model_validate({"id": "m", "head": "chat", "colour": "red"})
    with pytest.raises(ValidationError):  # chat without a window
        CatalogModel.model_validate({"id": "m", "head": "chat"})
    with pytest.raises(ValidationError):  # spot without its coefficient
        CatalogModel.model_validate({"id": "m", "head": "speech", "pricing": {"mode": "spot"}})


async def test_retrieve_one_model_as_listed(gateway: GatewayHarness) -> None:
    """``client.models.retrieve``: the card the list shows, or 404 where the list hides it."""
    client = gateway.openai(gateway.keys["user"])
    card = await client.models.retrieve("scripted-spot")
    assert card.id == "scripted-spot" and card.object == "model"
    listed = await _cards(gateway, gateway.keys["user"])
    assert card.model_dump(exclude_unset=True) == listed["scripted-spot"]
    async with gateway.client(gateway.keys["user"]) as http:
        unknown = await http.get("/v1/models/no-such-model")
        hidden = await http.get("/v1/models/external-chat")
    async with gateway.client(gateway.keys["external"]) as http:
        shown = await http.get("/v1/models/external-chat")
        slash = await http.get("/v1/models/")
    async with gateway.client() as http:
        anonymous = await http.get("/v1/models/scripted-chat")
    for resp in (unknown, hidden):
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == "model_not_found"
        assert resp.json()["error"]["param"] == "model"
    assert shown.status_code == 200 and "routing" in shown.json()
    assert slash.status_code == 200 and slash.json()["object"] == "list"
    assert anonymous.status_code == 401


async def test_openai_sdk_lists_models(gateway: GatewayHarness) -> None:
    client = gateway.openai(gateway.keys["external"])
    ids = [model.id async for model in client.models.list()]
    assert "external-chat" in ids and "scripted-chat" in ids
