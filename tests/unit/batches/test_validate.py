"""``validate_input`` on its own: how often it asks for a line's model."""

from __future__ import annotations

import json

from serve_app.batches.validate import MAX_LISTED_ERRORS, validate_input
from serve_app.catalog.config import CatalogModel
from serve_app.protocol.errors import model_not_found

URL = "/v1/chat/completions"


def _file(models: list[str]) -> bytes:
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": URL, "body": {"model": m}}
        for i, m in enumerate(models)
    ]
    return "\n".join(json.dumps(line) for line in lines).encode()


def test_each_model_is_resolved_once_and_none_after_the_listed_errors() -> None:
    """An organization's adapter is a SQL read: a file of many distinct unknown ids costs
    at most ``MAX_LISTED_ERRORS`` lookups (the batch fails anyway), a repeated id one."""
    asked: list[str] = []

    def unknown(model_id: str) -> CatalogModel:
        asked.append(model_id)
        raise model_not_found(model_id)

    data = _file(["base:same"] * 3 + [f"base:a{i}" for i in range(MAX_LISTED_ERRORS * 2)])
    checked = validate_input(data, URL, unknown, 10_000)
    assert len(checked.errors) == MAX_LISTED_ERRORS and not checked.lines
    assert asked.count("base:same") == 1
    assert len(asked) == MAX_LISTED_ERRORS - 2  # three 'same' lines listed from one lookup
    assert {e.code for e in checked.errors} == {"model_not_found"}
