"""A batch's output lines, and its output and error files written page by page.

Nothing here holds a batch's output whole: a line's result is capped when it is
stored (``batches.max_line_result_bytes``, the worker), finalization reads the
stored results in pages of at most ``PAGE_BYTES`` (``BatchStore.result_pages``),
writes them to temporary files on disk, and streams each file to the object store
(``put_file``). A replica finalizing a batch of any size holds about one page.
The functions are blocking: the worker runs them in a thread.
"""

from __future__ import annotations

import json
import tempfile
from datetime import datetime
from typing import Any, BinaryIO

from serve_app.batches.records import (
    CANCELLED,
    EXPIRED,
    LINE_DONE,
    SUCCEEDED,
    BatchRecord,
    line_request_id,
    output_file_id,
)
from serve_app.batches.store import BatchStore
from serve_app.files.store import FileRecord, object_key
from serve_app.storage.objects import ObjectStore

PAGE_BYTES = 8 << 20
"""Stored results one finalization read holds (a single larger line is read alone)."""
JSONL = "application/jsonl"
UNFINISHED_ERRORS = {
    EXPIRED: ("batch_expired", "This request could not be run before the batch expired."),
    CANCELLED: ("batch_cancelled", "This request was not run: the batch was cancelled."),
}


def answer_line(
    request_id: str, custom_id: str, status_code: int, body: str, headers: dict[str, str]
) -> str:
    """An answered line: OpenAI's ``{id, custom_id, response, error}`` around ``body``, the
    answer's JSON text as the route sent it (spliced, not parsed: a 10 MB embeddings
    answer is not turned into millions of Python floats and back); ``response.headers``
    carries the gateway's ``x-service-*`` headers (ignored parameters) when there are any."""
    head = json.dumps({"id": request_id, "custom_id": custom_id}, ensure_ascii=False)[:-1]
    response = json.dumps({"status_code": status_code, "request_id": request_id})[:-1]
    kept = f', "headers": {json.dumps(headers, ensure_ascii=False)}' if headers else ""
    return f'{head}, "response": {response}, "body": {body}{kept}}}, "error": null}}'


def error_line(request_id: str, custom_id: str, code: str, message: str) -> str:
    """A line with no answer (never run, abandoned, refused by the worker): ``response``
    null and ``error: {code, message}``."""
    line: dict[str, Any] = {
        "id": request_id,
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
    return json.dumps(line, ensure_ascii=False)


def write_files(
    store: BatchStore, objects: ObjectStore, batch: BatchRecord, status: str, now: datetime
) -> tuple[FileRecord | None, FileRecord | None]:
    """The output file (succeeded lines) and error file (failed ones, and, when the batch
    expired or was cancelled, those never run), in input order, stored in the object
    store; None for a file that would be empty."""
    code, message = UNFINISHED_ERRORS.get(status, UNFINISHED_ERRORS[EXPIRED])
    with tempfile.TemporaryFile() as output, tempfile.TemporaryFile() as errors:
        for page in store.result_pages(batch.id, PAGE_BYTES):
            for line in page:
                if line.status in LINE_DONE and line.result is not None:
                    target, text = (output if line.status == SUCCEEDED else errors), line.result
                else:
                    request_id = line_request_id(batch.id, line.custom_id)
                    target, text = errors, error_line(request_id, line.custom_id, code, message)
                target.write(text.encode())
                target.write(b"\n")
        return (
            _store(objects, batch, "output", output, now),
            _store(objects, batch, "error", errors, now),
        )


def _store(
    objects: ObjectStore, batch: BatchRecord, kind: str, handle: BinaryIO, now: datetime
) -> FileRecord | None:
    size = handle.tell()
    if size == 0:
        return None
    handle.seek(0)
    file_id = output_file_id(batch.id, kind)
    record = FileRecord(
        id=file_id,
        org_id=batch.org_id,
        user_id=batch.user_id,
        purpose="batch_output",
        filename=f"{batch.id}_{kind}.jsonl",
        bytes=size,
        object_key=object_key(file_id),
        created_at=now,
    )
    objects.put_file(record.object_key, handle, JSONL)
    return record
