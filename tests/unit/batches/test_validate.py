"""``validate_input`` on its own: how often it asks for a line's model."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from serve_app.batches.validate import MAX_LISTED_ERRORS, validate_input
from serve_app.catalog.config import CatalogModel
from serve_app.protocol.errors import model_not_found
from serve_app.storage.objects import LocalObjectStore

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
    assert len(checked.errors) == MAX_LISTED_ERRORS and checked.count == 0
    assert asked.count("base:same") == 1
    assert len(asked) == MAX_LISTED_ERRORS - 2  # three 'same' lines listed from one lookup
    assert {e.code for e in checked.errors} == {"model_not_found"}


def test_a_large_input_is_validated_without_holding_it(tmp_path: Path) -> None:
    """A 40 MB input read from the store in chunks: the lines kept are spooled to disk, so
    Python's peak stays far below the file (it held the file, its lines and the kept
    bodies, three times the file, when the file was read whole)."""
    model = CatalogModel.model_validate(
        {"id": "m", "head": "chat", "context_length": 64, "max_output_tokens": 32}
    )
    store = LocalObjectStore(tmp_path, secret=b"s")
    line = {"method": "POST", "url": URL, "body": {"model": "m", "messages": []}}
    content = "x" * 4000
    with (tmp_path / "input.jsonl").open("wb") as handle:
        for i in range(10_000):
            line["custom_id"] = f"r{i}"
            line["body"]["messages"] = [{"role": "user", "content": content}]  # type: ignore[index]
            handle.write(json.dumps(line).encode() + b"\n")
    with (tmp_path / "input.jsonl").open("rb") as source:
        store.put_file("files/input", source, "application/jsonl")
    tracemalloc.start()
    try:
        checked = validate_input(store.iter_chunks("files/input"), URL, lambda _: model, 50_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    try:
        assert not checked.errors and checked.count == 10_000
        rows = list(checked.rows())
        assert [r["custom_id"] for r in rows[:2]] == ["r0", "r1"] and rows[-1]["line"] == 10_000
        assert json.loads(rows[0]["body"])["messages"][0]["content"] == content
    finally:
        checked.close()
    assert peak < 16 << 20, peak


def test_line_numbers_and_bounds_read_from_chunks() -> None:
    """Lines cut across chunk edges keep their numbers (blank lines counted); more lines
    than allowed is the one error, with the whole count."""
    text = (
        b'{"custom_id": "a", "method": "POST", "url": "' + URL.encode() + b'", "body": {}}\n\n'
        b"not json\n"
    )
    chunks = [text[i : i + 7] for i in range(0, len(text), 7)]
    checked = validate_input(chunks, URL, lambda _: None, 10)  # type: ignore[arg-type,return-value]
    assert [(e.code, e.line) for e in checked.errors] == [("invalid_json_line", 3)]
    over = validate_input(text * 3, URL, lambda _: None, 5)  # type: ignore[arg-type,return-value]
    assert [e.code for e in over.errors] == ["maximum_requests_exceeded"]
    assert "has 6 requests" in over.errors[0].message and over.count == 0
