"""Validation of a batch's input file: the file-level rules, with OpenAI's error codes.

A file that breaks one fails the whole batch (status ``failed``, ``errors`` listing
each offending line): a line that is not a JSON object (``invalid_json_line``), a
missing or malformed ``custom_id``/``method``/``body`` (``invalid_request``), a
``url`` other than the batch's endpoint (``invalid_url``), a ``custom_id`` seen
before (``duplicate_custom_id``), a model the owner may not use on that endpoint
(``model_not_found``; on the chat endpoints a ``<base>:<adapter>`` id resolves as on
the route, to the owner's organization's or the catalog's LoRA adapter, another
organization's reading as unknown: docs/reference/adapters.md#batches), more lines
than allowed (``maximum_requests_exceeded``), no line at all (``empty_file``). What
the line's body says beyond its model is checked when the line runs, by the
endpoint's own rules, and a violation is that line's error in the error file
(docs/api.md, "Batches").

The file is read chunk by chunk from the object store and the lines kept are spooled
to a temporary file (``Validated.rows`` reads them back), so validating a 200 MB
input holds about one line, not the file and its lines.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from serve_app.batches.endpoints import ModelResolver, estimate_tokens
from serve_app.catalog.config import CatalogModel
from serve_app.protocol.batches import BatchError
from serve_app.protocol.errors import GatewayError

MAX_LISTED_ERRORS = 100
"""A file with thousands of bad lines lists the first ones (each with its line)."""
MAX_CUSTOM_ID_CHARS = 512


SPOOL_IN_MEMORY_BYTES = 1 << 20
"""Kept lines held in memory before their spool moves to disk."""


def _new_spool() -> IO[bytes]:
    """Memory up to ``SPOOL_IN_MEMORY_BYTES``, then a temporary file (``Validated.close``)."""
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES)


@dataclass
class Validated:
    """The lines to run (spooled: ``rows`` gives ``line``, ``custom_id``, ``body`` as JSON
    text), or errors. ``close`` removes the spool."""

    errors: list[BatchError] = field(default_factory=list)
    estimated_tokens: int = 0
    count: int = 0
    _spool: IO[bytes] = field(default_factory=lambda: _new_spool())

    def add(self, code: str, message: str, line: int | None, param: str | None = None) -> None:
        if len(self.errors) < MAX_LISTED_ERRORS:
            self.errors.append(BatchError(code=code, message=message, param=param, line=line))

    def keep(self, line: int, custom_id: str, body: str) -> None:
        """One line to run; ``body`` is compact of line breaks and tabs (``json.dumps``
        escapes them), so a tab after the header ends it."""
        self._spool.write(json.dumps([line, custom_id]).encode())
        self._spool.write(b"\t")
        self._spool.write(body.encode())
        self._spool.write(b"\n")
        self.count += 1

    def rows(self) -> Iterator[dict[str, Any]]:
        """The kept lines in file order, read back one by one."""
        self._spool.seek(0)
        for raw in self._spool:
            head, body = raw.rstrip(b"\n").split(b"\t", 1)
            line, custom_id = json.loads(head)
            yield {"line": line, "custom_id": custom_id, "body": body.decode()}

    def close(self) -> None:
        self._spool.close()


def _numbered_lines(chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """The file's lines (1-based numbers, blank ones included) from its chunks."""
    number = 0
    rest = b""
    for chunk in chunks:
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for raw in parts:
            number += 1
            yield number, raw
    yield number + 1, rest


class _Models:
    """The endpoint's model resolution (``endpoints.line_models``), once per model id
    and file."""

    def __init__(self, resolve: ModelResolver) -> None:
        self._resolve = resolve
        self.seen: dict[str, CatalogModel | GatewayError] = {}

    def resolve(self, model_id: str) -> CatalogModel | GatewayError:
        if model_id not in self.seen:
            try:
                self.seen[model_id] = self._resolve(model_id)
            except GatewayError as err:
                self.seen[model_id] = err
        return self.seen[model_id]


def validate_input(
    data: bytes | Iterable[bytes], endpoint: str, models: ModelResolver, max_lines: int
) -> Validated:
    """Check every line of ``data`` (the file, or its chunks) for a batch on ``endpoint``;
    ``models`` resolves a line's model as the endpoint's route would for the batch's owner
    (blocking: an organization's adapter is read from SQL, so this runs in a thread)."""
    result = Validated()
    resolver = _Models(models)
    seen: set[str] = set()
    requests = 0
    for number, raw in _numbered_lines([data] if isinstance(data, bytes) else data):
        if not raw.strip():
            continue
        requests += 1
        if requests <= max_lines:  # past it, only counted for the message
            _check_line(result, resolver, seen, endpoint, number, raw)
    if requests > max_lines:
        result.close()
        result = Validated()
        result.add(
            "maximum_requests_exceeded",
            f"The input file has {requests} requests; a batch holds at most {max_lines}.",
            None,
        )
    elif not requests:
        result.add("empty_file", "The input file has no requests.", None)
    return result


def _check_line(
    result: Validated, models: _Models, seen: set[str], endpoint: str, number: int, raw: bytes
) -> None:
    try:
        request = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        request = None
    if not isinstance(request, dict):
        result.add("invalid_json_line", "This line is not a JSON object.", number)
        return
    custom_id, body = request.get("custom_id"), request.get("body")
    problem = _shape_problem(request, endpoint)
    if problem is not None:
        code, message, param = problem
        result.add(code, message, number, param)
        return
    assert isinstance(custom_id, str) and isinstance(body, dict)
    if custom_id in seen:
        result.add(
            "duplicate_custom_id",
            f"The custom_id '{custom_id[:64]}' appears more than once in the file.",
            number,
            "custom_id",
        )
        return
    seen.add(custom_id)
    model: CatalogModel | None = None
    if len(result.errors) >= MAX_LISTED_ERRORS:
        return  # failed, and nothing more is listed: no more model lookups (SQL for adapters)
    if isinstance(body.get("model"), str):
        resolved = models.resolve(body["model"])
        if isinstance(resolved, GatewayError):
            result.add("model_not_found", resolved.message, number, "body.model")
            return
        model = resolved
    if result.errors:
        return  # the batch fails anyway: no need to keep lines
    tokens = estimate_tokens(endpoint, body, model) if model is not None else 0
    result.estimated_tokens += tokens
    result.keep(number, custom_id, json.dumps(body, ensure_ascii=False))


def _shape_problem(request: dict[str, Any], endpoint: str) -> tuple[str, str, str] | None:
    """(code, message, param) of the first shape rule the line breaks."""
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "invalid_request", "Each line needs a non-empty string 'custom_id'.", "custom_id"
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        return (
            "invalid_request",
            f"'custom_id' is longer than {MAX_CUSTOM_ID_CHARS} characters.",
            "custom_id",
        )
    if request.get("method") != "POST":
        return "invalid_request", "'method' must be 'POST'.", "method"
    url = request.get("url")
    if url != endpoint:
        shown = url[:128] if isinstance(url, str) else url
        return (
            "invalid_url",
            f"The line's url {shown!r} does not match the batch endpoint '{endpoint}'.",
            "url",
        )
    if not isinstance(request.get("body"), dict):
        return "invalid_request", "'body' must be a JSON object (the request body).", "body"
    return None
